// cuda_backend.cu — host side of the CUDA backend: device memory, uploads, launches,
// downloads, timing. Kernels live in forward.cu and backward.cu. Which stages are on the
// device, and how many bytes a case needs, come from the stage table (cuda_backend.h).
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <type_traits>
#include <variant>

#include "cuda_backend.h"
#include "cuda_check.h"
#include "kernels.h"

namespace mhc {
namespace {

// Owning device array; freed on scope exit.
template <class T> struct DeviceArray {
  T* p = nullptr;
  size_t n = 0;
  DeviceArray() = default;
  explicit DeviceArray(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T))); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p, o.p), std::swap(n, o.n);
    return *this;
  }
  ~DeviceArray() { cudaFree(p); }  // nothing to report from a destructor
};

template <class T> constexpr DType device_dtype();
template <> constexpr DType device_dtype<__nv_bfloat16>() { return DType::bf16; }
template <> constexpr DType device_dtype<float>() { return DType::f32; }

// A stage on the device, in its stored dtype.
using StageArray = std::variant<DeviceArray<__nv_bfloat16>, DeviceArray<float>>;

template <class T> void upload(DeviceArray<T>& d, const Tensor& t, const char* name) {
  MHC_CHECK(t.dtype == device_dtype<T>() && t.bytes.size() == d.n * sizeof(T), "upload of ", name, " (",
            dtype_name(t.dtype), " ", shape_str(t.shape), ")");
  CUDA_CHECK(cudaMemcpy(d.p, t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice));
}

template <class T> void download(const DeviceArray<T>& d, const Problem& p, const Stage& s, Case& c) {
  Tensor t(stage_shape(s, p), s.dtype);
  MHC_CHECK(t.dtype == device_dtype<T>() && t.bytes.size() == d.n * sizeof(T), "download of ", s.name);
  CUDA_CHECK(cudaMemcpy(t.bytes.data(), d.p, t.bytes.size(), cudaMemcpyDeviceToHost));
  c.t[s.name] = std::move(t);
}

// All-ones bytes: NaN in float32 and in bf16, so an element a kernel fails to write
// shows up as NaN in the diff instead of as a stale value from an earlier run.
template <class T> void poison(DeviceArray<T>& a) { CUDA_CHECK(cudaMemset(a.p, 0xff, a.n * sizeof(T))); }

// A stage's device pointer; it converts to the typed pointer a params field wants, checking
// that the stage has that dtype on the device.
struct StagePtr {
  const StageArray* a;
  const char* name;
  template <class T> operator T*() const {
    auto* d = std::get_if<DeviceArray<std::remove_const_t<T>>>(a);
    MHC_CHECK(d, "stage ", name, " is not ", dtype_name(device_dtype<std::remove_const_t<T>>()), " on the device");
    return d->p;
  }
};

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(size_t(1) << 30));
  return buf;
}

void require_device() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0)
    fail("no CUDA device: ", err != cudaSuccess ? cudaGetErrorString(err) : "none found",
         " (the cuda backend needs an NVIDIA GPU; the cpu backends need none)");
}

// Everything one case needs on the device; the parameter structs point into it.
struct DeviceCase {
  Problem prob;
  bool backward, keep_dvecX;
  double need = 0;  // bytes of every allocation below (cuda_case_bytes), known before the first
  size_t free_bytes = 0, total_bytes = 0, allocated = 0;
  std::map<std::string, StageArray> stages;                   // every stage on the device, by name
  DeviceArray<float> pg, fwd_scratch, g_tok, a_tok, partial;  // buffers that are no stage (cuda_scratch)
  cuda::FwdParams fwd{};
  cuda::BwdParams bwd{};

  DeviceCase(const Case& c, bool backward_, bool keep_dvecX_)
      : prob(c.prob), backward(backward_), keep_dvecX(backward_ && keep_dvecX_) {
    require_device();
    if (std::string why = cuda_unsupported(prob); !why.empty()) fail(why);
    CudaGeometry geo;
    geo.fwd_scratch_floats = cuda::forward_scratch_floats(prob.T(), int(prob.n), int(prob.D));
    if (backward) geo.splits = cuda::token_splits(prob.T(), prob.K());
    need = cuda_case_bytes(prob, backward, keep_dvecX, geo);
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (need > double(free_bytes)) fail("cuda: ", memory_need());

    for (const Stage& s : stage_table()) {
      if (!cuda_on_device(s, backward, keep_dvecX)) continue;
      MHC_CHECK(s.dtype == DType::bf16 || s.dtype == DType::f32, "stage ", s.name);
      StageArray& a = stages.emplace(s.name, s.dtype == DType::bf16 ? StageArray(alloc<__nv_bfloat16>(s))
                                                                     : StageArray(alloc<float>(s)))
                          .first->second;
      if (s.group == Group::inputs) std::visit([&](auto& d) { upload(d, c.get(s.name), s.name); }, a);
    }
    const CudaScratch sc = cuda_scratch(prob, backward, geo);
    const size_t K = size_t(prob.K()), N = size_t(prob.N());
    Tensor pgh = c.get("phi");  // gamma folded into phi, in float as the CPU golden does
    const float* g = c.get("gamma").data<float>();
    for (size_t j = 0; j < N; ++j)
      for (size_t k = 0; k < K; ++k) pgh.data<float>()[j * K + k] *= g[k];
    pg = alloc<float>("pg", sc.pg);
    upload(pg, pgh, "pg");
    fwd_scratch = alloc<float>("fwd_scratch", sc.fwd);
    if (backward) {
      g_tok = alloc<float>("g_tok", sc.g_tok), a_tok = alloc<float>("a_tok", sc.a_tok);
      partial = alloc<float>("partial", sc.partial);
    }
    MHC_CHECK(double(allocated) == need, "allocated ", allocated, " bytes, cuda_case_bytes counts ", need);

    fwd.x = at("x"), fwd.pg = pg.p, fwd.alpha = at("alpha"), fwd.bias = at("bias");
    fwd.inv_rms = at("inv_rms"), fwd.h_mix = at("h_mix"), fwd.h_pre = at("h_pre"), fwd.h_post = at("h_post");
    fwd.h_res = at("h_res"), fwd.h_in = at("h_in"), fwd.scratch = fwd_scratch.p;
    fwd.T = prob.T(), fwd.n = int(prob.n), fwd.D = int(prob.D);
    fwd.norm_eps = float(prob.norm_eps), fwd.hc_eps = float(prob.hc_eps);
    if (!backward) return;
    bwd.x = at("x"), bwd.dh_in = at("dh_in"), bwd.dh_post = at("dh_post"), bwd.dh_res = at("dh_res");
    bwd.phi = at("phi"), bwd.gamma = at("gamma"), bwd.alpha = at("alpha"), bwd.bias = at("bias");
    bwd.inv_rms = at("inv_rms"), bwd.h_mix = at("h_mix"), bwd.h_pre = at("h_pre"), bwd.h_post = at("h_post");
    bwd.dh_pre = at("dh_pre"), bwd.dh_mix = at("dh_mix"), bwd.dinv_rms = at("dinv_rms");
    bwd.dvecX = keep_dvecX ? static_cast<float*>(at("dvecX")) : nullptr;
    bwd.dx = at("dx"), bwd.g_tok = g_tok.p, bwd.a_tok = a_tok.p, bwd.partial = partial.p;
    bwd.dphi = at("dphi"), bwd.dalpha = at("dalpha"), bwd.dbias = at("dbias"), bwd.dgamma = at("dgamma");
    bwd.T = prob.T(), bwd.n = int(prob.n), bwd.D = int(prob.D), bwd.splits = int(geo.splits);
    bwd.hc_eps = float(prob.hc_eps), bwd.pre_low = float(prob.hc_eps / kPreLow), bwd.gate_high = float(kGateHigh);
  }

  StagePtr at(const char* name) const {
    auto it = stages.find(name);
    MHC_CHECK(it != stages.end(), "stage ", name, " is not on the device");
    return {&it->second, name};
  }

  // "the case needs 2.31 GiB of device memory (T=4096 n=4 D=16384, forward + backward, dvecX kept),
  // the device has 0.61 GiB free of 79.19 GiB"
  std::string memory_need() const {
    return cat("the case needs ", gib(need), " of device memory (", prob.str(),
               backward ? ", forward + backward" : ", forward", keep_dvecX ? ", dvecX kept" : "",
               "), the device has ", gib(double(free_bytes)), " free of ", gib(double(total_bytes)));
  }

  // Out of device memory although the check above passed (another process, fragmentation):
  // the same one-line error, naming the buffer.
  template <class T> DeviceArray<T> alloc(const char* name, double count) {
    try {
      DeviceArray<T> a{size_t(count)};
      allocated += a.n * sizeof(T);
      return a;
    } catch (const CudaOutOfMemory&) {
      fail("cuda: out of device memory allocating ", name, " (", gib(count * double(sizeof(T))), "): ", memory_need());
    }
  }
  template <class T> DeviceArray<T> alloc(const Stage& s) { return alloc<T>(s.name, stage_elements(s, prob)); }

  // Every computed stage set to all-ones bytes (NaN in bf16 and float alike) before the kernels run.
  void poison_computed() {
    for (auto& [name, a] : stages)
      if (stage(name).group != Group::inputs) std::visit([](auto& d) { poison(d); }, a);
  }

  // Backward alone reads the forward stages from the case instead of computing them.
  void upload_forward(const Case& c) {
    for (const Stage& s : stage_table())
      if (cuda_backward_reads(s))
        std::visit([&](auto& d) { upload(d, convert(c.get(s.name), s.dtype), s.name); }, stages.at(s.name));
  }

  // The stages `pass` computed into c: the forward's unless a backward alone, the backward's when it ran.
  void download_into(Case& c, Pass pass) const {
    for (const Stage& s : stage_table()) {
      if (s.group == Group::inputs || (s.group == Group::forward && pass == Pass::bwd)) continue;
      if (auto it = stages.find(s.name); it != stages.end())
        std::visit([&](const auto& d) { download(d, prob, s, c); }, it->second);
    }
  }
};

}  // namespace

std::string cuda_device_name() {
  require_device();
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return cat(prop.name, " (sm_", prop.major, prop.minor, ")");
}

namespace {

// A pass's launches captured once into a CUDA graph, then launched as one on the default stream:
// the GPU is handed the whole chain of kernels at once (the issue's "a CUDA graph the backend
// captures once per shape"). A programmatic dependent launch (launch_after) is captured as a
// programmatic edge, so it keeps its early start.
class PassGraph {
 public:
  template <class F> explicit PassGraph(F&& launches) {
    try {
      CUDA_CHECK(cudaStreamCreateWithFlags(&capture_, cudaStreamNonBlocking));
      CUDA_CHECK(cudaStreamBeginCapture(capture_, cudaStreamCaptureModeRelaxed));
      capturing_ = true;
      launches(capture_);
      capturing_ = false;
      CUDA_CHECK(cudaStreamEndCapture(capture_, &graph_));
      CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    } catch (...) {
      release();
      throw;
    }
  }
  PassGraph(const PassGraph&) = delete;
  PassGraph& operator=(const PassGraph&) = delete;
  ~PassGraph() { release(); }
  void launch() const { CUDA_CHECK(cudaGraphLaunch(exec_, 0)); }

 private:
  void release() {  // nothing to report from here: the error that brought us here is
    if (capturing_) {
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(capture_, &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
      (void)cudaGetLastError();
      capturing_ = false;
    }
    if (exec_) cudaGraphExecDestroy(exec_), exec_ = nullptr;
    if (graph_) cudaGraphDestroy(graph_), graph_ = nullptr;
    if (capture_) cudaStreamDestroy(capture_), capture_ = nullptr;
  }
  cudaStream_t capture_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  bool capturing_ = false;
};

// The kernels of `pass` on d, as one graph; a backward alone reads the forward's stages already
// on the device.
PassGraph pass_graph(DeviceCase& d, Pass pass) {
  return PassGraph([&](cudaStream_t s) {
    if (pass != Pass::bwd) cuda::launch_forward(d.fwd, s);
    if (d.backward) cuda::launch_backward(d.bwd, s);
  });
}

}  // namespace

void cuda_run(Case& c, Pass pass, bool dump_intermediates) {
  const bool backward = pass != Pass::fwd && c.has_gradients();
  DeviceCase d(c, backward, dump_intermediates);
  d.poison_computed();
  if (pass == Pass::bwd) d.upload_forward(c);
  pass_graph(d, pass).launch();
  CUDA_CHECK(cudaDeviceSynchronize());
  d.download_into(c, pass);
  c.attrs["backend"] = "cuda";
  c.attrs["precision"] = "fp32";
  c.attrs["device"] = cuda_device_name();
}

namespace {

// Milliseconds of each of `repeat` calls of fn after `warmup` untimed ones, by CUDA events.
// Before every call a buffer of 4x the L2 size is written, so no call finds its inputs in L2.
template <class F> std::vector<double> time_flushed(int warmup, int repeat, F&& fn) {
  int dev = 0, l2 = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  DeviceArray<unsigned char> flush(4 * size_t(l2));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < warmup + repeat; ++i) {
    CUDA_CHECK(cudaMemsetAsync(flush.p, i & 0xff, flush.n));
    CUDA_CHECK(cudaEventRecord(start));
    fn();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (i >= warmup) ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return ms;
}

}  // namespace

std::vector<double> cuda_bench(const Case& c, Pass pass, int warmup, int repeat) {
  const bool backward = pass != Pass::fwd;
  DeviceCase d(c, backward, false);
  if (pass == Pass::bwd) cuda::launch_forward(d.fwd, 0);  // the forward stages backward reads
  const PassGraph graph = pass_graph(d, pass);
  return time_flushed(warmup, repeat, [&] { graph.launch(); });
}

double cuda_copy_gbps() {
  require_device();
  const size_t bytes = size_t(1) << 30;
  DeviceArray<unsigned char> src(bytes), dst(bytes);
  CUDA_CHECK(cudaMemset(src.p, 1, bytes));
  std::vector<double> ms =
      time_flushed(2, 10, [&] { CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice)); });
  std::sort(ms.begin(), ms.end());
  return 2.0 * double(bytes) / (ms[ms.size() / 2] * 1e-3) / 1e9;  // read + written
}

}  // namespace mhc

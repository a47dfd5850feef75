// cuda_backend.cu — host side of the CUDA backend: device memory, uploads, launches,
// downloads, timing. Kernels live in forward.cu and backward.cu.
#include <algorithm>
#include <memory>

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

template <class T> DeviceArray<T> upload(const Tensor& t) {
  MHC_CHECK(t.bytes.size() == size_t(t.size()) * sizeof(T), "upload of a ", dtype_name(t.dtype), " tensor");
  DeviceArray<T> d(size_t(t.size()));
  CUDA_CHECK(cudaMemcpy(d.p, t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice));
  return d;
}

template <class T> void download(const DeviceArray<T>& d, const Problem& p, const char* name, Case& c) {
  const Stage& s = stage(name);
  Tensor t(stage_shape(s, p), s.dtype);
  MHC_CHECK(t.bytes.size() == d.n * sizeof(T), "download of ", name);
  CUDA_CHECK(cudaMemcpy(t.bytes.data(), d.p, t.bytes.size(), cudaMemcpyDeviceToHost));
  c.t[name] = std::move(t);
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
  DeviceArray<__nv_bfloat16> x, dh_in, h_in, dx;
  DeviceArray<float> pg, phi, gamma, alpha, bias, dh_post, dh_res;
  DeviceArray<float> inv_rms, h_mix, h_pre, h_post, h_res, fwd_scratch;
  DeviceArray<float> dh_pre, dh_mix, dinv_rms, dvecX, g_tok, a_tok, partial, dphi, dalpha, dbias, dgamma;
  cuda::FwdParams fwd{};
  cuda::BwdParams bwd{};

  DeviceCase(const Case& c, bool backward, bool keep_dvecX) : prob(c.prob) {
    require_device();
    if (prob.n < 1 || prob.n > 8) fail("the cuda backend supports n = 1..8, this case has n = ", prob.n);
    const size_t T = size_t(prob.T()), K = size_t(prob.K()), N = size_t(prob.N()), n = size_t(prob.n),
                 D = size_t(prob.D);
    x = upload<__nv_bfloat16>(c.get("x"));
    alpha = upload<float>(c.get("alpha"));
    bias = upload<float>(c.get("bias"));
    // gamma folded into phi, in float as the CPU golden does
    Tensor pgh = c.get("phi");
    const float* g = c.get("gamma").data<float>();
    for (size_t j = 0; j < N; ++j)
      for (size_t k = 0; k < K; ++k) pgh.data<float>()[j * K + k] *= g[k];
    pg = upload<float>(pgh);
    inv_rms = DeviceArray<float>(T), h_mix = DeviceArray<float>(T * N), h_pre = DeviceArray<float>(T * n);
    h_post = DeviceArray<float>(T * n), h_res = DeviceArray<float>(T * n * n), h_in = DeviceArray<__nv_bfloat16>(T * D);
    fwd_scratch = DeviceArray<float>(size_t(cuda::forward_scratch_floats(prob.T(), int(prob.n), int(prob.D))));
    fwd = {x.p, pg.p, alpha.p, bias.p, inv_rms.p, h_mix.p, h_pre.p, h_post.p, h_res.p, h_in.p, fwd_scratch.p,
           prob.T(), int(prob.n), int(prob.D), float(prob.norm_eps), float(prob.hc_eps)};
    if (!backward) return;
    dh_in = upload<__nv_bfloat16>(c.get("dh_in"));
    dh_post = upload<float>(c.get("dh_post"));
    dh_res = upload<float>(c.get("dh_res"));
    phi = upload<float>(c.get("phi"));
    gamma = upload<float>(c.get("gamma"));
    int splits = cuda::token_splits(prob.T(), prob.K());
    dh_pre = DeviceArray<float>(T * n), dh_mix = DeviceArray<float>(T * N), dinv_rms = DeviceArray<float>(T);
    if (keep_dvecX) dvecX = DeviceArray<float>(T * K);
    dx = DeviceArray<__nv_bfloat16>(T * K), g_tok = DeviceArray<float>(T * N), a_tok = DeviceArray<float>(T * 3);
    partial = DeviceArray<float>(size_t(splits) * N * K), dphi = DeviceArray<float>(N * K);
    dalpha = DeviceArray<float>(3), dbias = DeviceArray<float>(N), dgamma = DeviceArray<float>(K);
    bwd = {x.p, dh_in.p, dh_post.p, dh_res.p, phi.p, gamma.p, alpha.p, inv_rms.p, h_mix.p, h_pre.p, h_post.p,
           dh_pre.p, dh_mix.p, dinv_rms.p, keep_dvecX ? dvecX.p : nullptr, dx.p, g_tok.p, a_tok.p, partial.p,
           dphi.p, dalpha.p, dbias.p, dgamma.p, prob.T(), int(prob.n), int(prob.D), splits, float(prob.hc_eps)};
  }

  // Backward alone reads the forward stages from the case instead of computing them.
  void upload_forward(const Case& c) {
    for (auto [name, arr] : {std::pair{"inv_rms", &inv_rms}, std::pair{"h_mix", &h_mix}, std::pair{"h_pre", &h_pre},
                             std::pair{"h_post", &h_post}}) {
      Tensor t = convert(c.get(name), DType::f32);
      CUDA_CHECK(cudaMemcpy(arr->p, t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice));
    }
  }
};

// All-ones bytes: NaN in float32 and in bf16, so an element a kernel fails to write
// shows up as NaN in the diff instead of as a stale value from an earlier run.
template <class T> void poison(DeviceArray<T>& a) { CUDA_CHECK(cudaMemset(a.p, 0xff, a.n * sizeof(T))); }

}  // namespace

std::string cuda_device_name() {
  require_device();
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return cat(prop.name, " (sm_", prop.major, prop.minor, ")");
}

void cuda_run(Case& c, Pass pass, bool dump_intermediates) {
  const bool backward = pass != Pass::fwd && c.has_gradients();
  DeviceCase d(c, backward, dump_intermediates);
  for (auto* a : {&d.inv_rms, &d.h_mix, &d.h_pre, &d.h_post, &d.h_res, &d.dh_pre, &d.dh_mix, &d.dinv_rms, &d.dvecX,
                  &d.dphi, &d.dalpha, &d.dbias, &d.dgamma})
    if (a->p) poison(*a);
  for (auto* a : {&d.h_in, &d.dx})
    if (a->p) poison(*a);
  if (pass == Pass::bwd)
    d.upload_forward(c);
  else
    cuda::launch_forward(d.fwd, 0);
  if (backward) cuda::launch_backward(d.bwd, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  const Problem& p = c.prob;
  if (pass != Pass::bwd) {
    download(d.inv_rms, p, "inv_rms", c), download(d.h_mix, p, "h_mix", c), download(d.h_pre, p, "h_pre", c);
    download(d.h_post, p, "h_post", c), download(d.h_res, p, "h_res", c), download(d.h_in, p, "h_in", c);
  }
  if (backward) {
    download(d.dh_pre, p, "dh_pre", c), download(d.dh_mix, p, "dh_mix", c), download(d.dinv_rms, p, "dinv_rms", c);
    if (dump_intermediates) download(d.dvecX, p, "dvecX", c);
    download(d.dx, p, "dx", c), download(d.dphi, p, "dphi", c), download(d.dalpha, p, "dalpha", c);
    download(d.dbias, p, "dbias", c), download(d.dgamma, p, "dgamma", c);
  }
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
  return time_flushed(warmup, repeat, [&] {
    if (pass != Pass::bwd) cuda::launch_forward(d.fwd, 0);
    if (backward) cuda::launch_backward(d.bwd, 0);
  });
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

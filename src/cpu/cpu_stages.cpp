// cpu_stages.cpp — the mHC pre operator, stage by stage, as the formulas write it.
// Template parameter R is the arithmetic type: float (fp32 golden) or double (fp64 oracle).
#include <Eigen/Dense>
#include <cmath>
#include <cstring>

#include "cpu_backend.h"
#include "gate_tails.h"

namespace mhc {
namespace {

constexpr int64_t kTokChunk = 32;     // tokens per parallel work item
constexpr int64_t kColSlice = 256;    // columns per work item in reductions over tokens

template <class R> using Mat = Eigen::Matrix<R, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class R> using MapC = Eigen::Map<const Mat<R>>;
template <class R> using MapM = Eigen::Map<Mat<R>>;
template <class R> using VecC = Eigen::Map<const Eigen::Matrix<R, Eigen::Dynamic, 1>>;

const Tensor& dep(const TensorMap& in, const char* name) {
  auto it = in.find(name);
  MHC_CHECK(it != in.end(), "missing dependency ", name);
  return it->second;
}

// dst[r - r0][c - c0] = t viewed as [rows, width], for rows [r0,r1) and columns [c0,c1).
template <class R>
void block_as(const Tensor& t, int64_t width, int64_t r0, int64_t r1, int64_t c0, int64_t c1, R* dst) {
  int64_t w = c1 - c0;
  for (int64_t r = r0; r < r1; ++r) {
    int64_t src = r * width + c0;
    R* out = dst + (r - r0) * w;
    switch (t.dtype) {
      case DType::bf16: {
        const bf16* s = t.data<bf16>() + src;
        for (int64_t c = 0; c < w; ++c) out[c] = R(bf16_to_float(s[c]));
      } break;
      case DType::f32: {
        const float* s = t.data<float>() + src;
        for (int64_t c = 0; c < w; ++c) out[c] = R(s[c]);
      } break;
      case DType::f64: {
        const double* s = t.data<double>() + src;
        for (int64_t c = 0; c < w; ++c) out[c] = R(s[c]);
      } break;
    }
  }
}

template <class R> void row_as(const Tensor& t, int64_t width, int64_t r, R* dst) {
  block_as(t, width, r, r + 1, 0, width, dst);
}

template <class R> std::vector<R> all_as(const Tensor& t) {
  std::vector<R> v(static_cast<size_t>(t.size()));
  block_as(t, t.size(), 0, 1, 0, t.size(), v.data());
  return v;
}

// Read-only data as R: the tensor's own memory when the dtype matches, else a converted copy.
template <class R> struct As {
  const R* p;
  std::vector<R> own;
  explicit As(const Tensor& t) {
    if (t.dtype == dtype_of<R>()) {
      p = t.data<R>();
    } else {
      own = all_as<R>(t);
      p = own.data();
    }
  }
};

// out.flat[offset .. offset+len) = src, rounded to out's dtype (bf16 stages) or copied.
template <class R> void store(Tensor& out, int64_t offset, const R* src, int64_t len) {
  if (out.dtype == DType::bf16) {
    bf16* d = out.data<bf16>() + offset;
    for (int64_t i = 0; i < len; ++i) d[i] = sizeof(R) == 8 ? double_to_bf16(src[i]) : float_to_bf16(float(src[i]));
  } else {
    R* d = out.data<R>() + offset;
    std::copy(src, src + len, d);
  }
}

// Fixed-order pairwise sum of a[0], a[stride], ..., a[(len-1)*stride].
template <class R> R pairwise_sum(const R* a, int64_t len, int64_t stride) {
  if (len <= 8) {
    R s = 0;
    for (int64_t i = 0; i < len; ++i) s += a[i * stride];
    return s;
  }
  int64_t h = len / 2;
  return pairwise_sum(a, h, stride) + pairwise_sum(a + h * stride, len - h, stride);
}

// Step i of a chain of len terms: index i, or len - 1 - i in a reversed plain evaluation.
inline int64_t step(int64_t i, int64_t len, const Arith& ar) { return ar.reversed ? len - 1 - i : i; }

// a[0] + a[stride] + ... in one left-to-right chain (plain evaluations; reversed: right to
// left), else pairwise.
template <class R> R sum_in_order(const R* a, int64_t len, int64_t stride, const Arith& ar) {
  if (!ar.plain) return pairwise_sum(a, len, stride);
  R s = 0;
  for (int64_t i = 0; i < len; ++i) s += a[step(i, len, ar) * stride];
  return s;
}

// A GEMM operand as a plain evaluation reads it (cpu_backend.h).
template <class R> R operand(R v, Operands o) {
  if constexpr (sizeof(R) == 4) {
    if (o == Operands::bf16) return bf16_to_float(float_to_bf16(v));
    if (o == Operands::tf32) {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      u &= 0xffffe000u;
      std::memcpy(&v, &u, 4);
    }
  }
  return v;
}

template <class R> std::vector<R> operands(std::vector<R> v, Operands o) {
  if (o != Operands::exact)
    for (R& e : v) e = operand(e, o);
  return v;
}

template <class R> R sigmoid(R z) { return R(1) / (R(1) + std::exp(-z)); }
// A gate's argument z = alpha·t + bias, t = h_mix·inv_rms (the forward's gates and g_pre's sigmoid).
template <class R> R gate_z(R alpha, R h_mix, R inv_rms, R bias) { return alpha * (h_mix * inv_rms) + bias; }

// ---------------------------------------------------------------- forward

// inv_rms[t] = 1/sqrt(mean_k x[t,k]^2 + norm_eps); x is [T,K]
template <class R> void inv_rms(const Problem& p, const TensorMap& in, const Arith& a, Tensor& out) {
  const Tensor& x = dep(in, "x");
  const int64_t T = p.T(), K = p.K();
  std::vector<R> r(static_cast<size_t>(T));
#pragma omp parallel
  {
    std::vector<R> v(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      row_as(x, K, t, v.data());
      for (R& e : v) e *= e;  // exact for bf16 x: 16 significant bits
      R ms = sum_in_order(v.data(), K, 1, a) / R(K);
      r[size_t(t)] = R(1) / std::sqrt(ms + R(p.norm_eps));
    }
  }
  store(out, 0, r.data(), T);
}

// h_mix[T,N] = (x ⊙ gamma)[T,K] · phi[N,K]^T, gamma folded into phi
template <class R> void h_mix(const Problem& p, const TensorMap& in, const Arith& a, Tensor& out) {
  const Tensor& x = dep(in, "x");
  const int64_t T = p.T(), K = p.K(), N = p.N();
  std::vector<R> pg = all_as<R>(dep(in, "phi")), g = all_as<R>(dep(in, "gamma"));
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k) pg[size_t(j * K + k)] *= g[size_t(k)];
  R* h = out.data<R>();
  if (a.plain) {  // one chain over k per (t, j); pgT is [K,N]
    std::vector<R> pgT(pg.size());
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) pgT[size_t(k * N + j)] = operand(pg[size_t(j * K + k)], a.operands);
#pragma omp parallel
    {
      std::vector<R> v(static_cast<size_t>(K));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        row_as(x, K, t, v.data());
        R* acc = h + t * N;
        std::fill(acc, acc + N, R(0));
        for (int64_t i = 0; i < K; ++i) {
          const int64_t k = step(i, K, a);
          for (int64_t j = 0; j < N; ++j) acc[j] += v[size_t(k)] * pgT[size_t(k * N + j)];
        }
      }
    }
    return;
  }
#pragma omp parallel
  {
    std::vector<R> v(static_cast<size_t>(kTokChunk * K));
#pragma omp for schedule(static)
    for (int64_t t0 = 0; t0 < T; t0 += kTokChunk) {
      int64_t rows = std::min(kTokChunk, T - t0);
      block_as(x, K, t0, t0 + rows, 0, K, v.data());
      MapM<R>(h + t0 * N, rows, N).noalias() = MapC<R>(v.data(), rows, K) * MapC<R>(pg.data(), N, K).transpose();
    }
  }
}

// The three gates read t = h_mix·inv_rms; `first` is the group's first row of phi.
template <class R> void gate(const char* name, const Problem& p, const TensorMap& in, Tensor& out) {
  const int64_t T = p.T(), N = p.N(), n = p.n;
  As<R> hm(dep(in, "h_mix")), ir(dep(in, "inv_rms"));
  std::vector<R> a = all_as<R>(dep(in, "alpha")), b = all_as<R>(dep(in, "bias"));
  const int which = name == std::string("h_pre") ? 0 : name == std::string("h_post") ? 1 : 2;
  const int64_t first = which == 0 ? 0 : which == 1 ? n : 2 * n, width = which == 2 ? n * n : n;
  std::vector<R> r(static_cast<size_t>(T * width));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < width; ++j) {
      R z = gate_z(a[size_t(which)], hm.p[t * N + first + j], ir.p[t], b[size_t(first + j)]);
      r[size_t(t * width + j)] = which == 0 ? sigmoid(z) + R(p.hc_eps) : which == 1 ? R(2) * sigmoid(z) : z;
    }
  store(out, 0, r.data(), T * width);
}

// h_in[t,d] = sum_i h_pre[t,i] x[t,i,d]
template <class R> void h_in(const Problem& p, const TensorMap& in, const Arith& a, Tensor& out) {
  const Tensor& x = dep(in, "x");
  const int64_t T = p.T(), n = p.n, D = p.D;
  As<R> hp(dep(in, "h_pre"));
#pragma omp parallel
  {
    std::vector<R> v(static_cast<size_t>(n * D)), acc(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      row_as(x, n * D, t, v.data());
      std::fill(acc.begin(), acc.end(), R(0));
      for (int64_t q = 0; q < n; ++q) {
        const int64_t i = step(q, n, a);
        for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += hp.p[t * n + i] * v[size_t(i * D + d)];
      }
      store(out, t * D, acc.data(), D);
    }
  }
}

// ---------------------------------------------------------------- backward

// Per-token gate gradients g = [g_pre, g_post, g_res] (before alpha), shared by dh_mix,
// dinv_rms, dalpha and dbias. g_pre's s and 1 − s: from h_pre, or from z in their tails (kPreLow),
// g_post's from h_post, or from z in its upper tail (kGateHigh); from z only where z puts the gate
// in that tail too (in_tail),
// except in plain evaluations: the budget is what a correct kernel that recovers s from h_pre
// everywhere can be off (with the tails exact there, such a kernel failed dalpha and dbias).
template <class R> struct GateGrads {
  const Problem& p;
  As<R> dh_pre, dh_post, dh_res, h_pre, h_post, h_mix, inv_rms;
  std::vector<R> alpha, bias;
  bool tails;
  GateGrads(const Problem& prob, const TensorMap& in, const Arith& a)
      : p(prob), dh_pre(dep(in, "dh_pre")), dh_post(dep(in, "dh_post")), dh_res(dep(in, "dh_res")),
        h_pre(dep(in, "h_pre")), h_post(dep(in, "h_post")), h_mix(dep(in, "h_mix")), inv_rms(dep(in, "inv_rms")),
        alpha(all_as<R>(dep(in, "alpha"))), bias(all_as<R>(dep(in, "bias"))), tails(!a.plain) {}
  void operator()(int64_t t, R* g) const {  // g is [N]
    const int64_t n = p.n, N = p.N();
    const R low = R(p.hc_eps / kPreLow), high = R(kGateHigh);
    for (int64_t i = 0; i < n; ++i) {
      R s = h_pre.p[t * n + i] - R(p.hc_eps), r = R(1) - s;  // s and 1 - s
      if (tails && (s < low || r < high)) {
        const R z = gate_z(alpha[0], h_mix.p[t * N + i], inv_rms.p[t], bias[size_t(i)]);
        const R sz = sigmoid(z), rz = sigmoid(-z);
        if (in_tail(s, r, sz, rz, low, high)) s = sz, r = rz;
      }
      g[i] = dh_pre.p[t * n + i] * s * r;
      const R hpo = h_post.p[t * n + i], q = R(1) - hpo / R(2);  // h_post = 2 sigmoid(z), q = sigmoid(-z)
      g[n + i] = dh_post.p[t * n + i] * hpo * q;
      if (tails && q < high) {
        const R z = gate_z(alpha[1], h_mix.p[t * N + n + i], inv_rms.p[t], bias[size_t(n + i)]);
        const R sz = sigmoid(z), rz = sigmoid(-z);
        if (in_tail(R(1), q, sz, rz, R(0), high)) g[n + i] = dh_post.p[t * n + i] * R(2) * sz * rz;
      }
    }
    for (int64_t j = 0; j < n * n; ++j) g[2 * n + j] = dh_res.p[t * n * n + j];
  }
  R alpha_of(const std::vector<R>& alpha, int64_t j) const {
    return alpha[size_t(j < p.n ? 0 : j < 2 * p.n ? 1 : 2)];
  }
};

// dh_pre[t,i] = sum_d dh_in[t,d] x[t,i,d]
template <class R> void dh_pre(const Problem& p, const TensorMap& in, const Arith& a, Tensor& out) {
  const Tensor &x = dep(in, "x"), &dhin = dep(in, "dh_in");
  const int64_t T = p.T(), n = p.n, D = p.D;
  std::vector<R> r(static_cast<size_t>(T * n));
#pragma omp parallel
  {
    std::vector<R> v(static_cast<size_t>(n * D)), g(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      row_as(x, n * D, t, v.data());
      row_as(dhin, D, t, g.data());
      for (int64_t i = 0; i < n; ++i) {
        R s = 0;
        if (a.plain)
          for (int64_t q = 0; q < D; ++q) {
            const int64_t d = step(q, D, a);
            s += g[size_t(d)] * v[size_t(i * D + d)];
          }
        else
          s = VecC<R>(g.data(), D).dot(VecC<R>(v.data() + i * D, D));
        r[size_t(t * n + i)] = s;
      }
    }
  }
  store(out, 0, r.data(), T * n);
}

// dh_mix[t,j] = alpha(j) g[t,j] inv_rms[t]
template <class R> void dh_mix(const Problem& p, const TensorMap& in, const Arith& a, Tensor& out) {
  const int64_t T = p.T(), N = p.N();
  GateGrads<R> gg(p, in, a);
  As<R> ir(dep(in, "inv_rms"));
  std::vector<R> r(static_cast<size_t>(T * N));
  for (int64_t t = 0; t < T; ++t) {
    R* g = &r[size_t(t * N)];
    gg(t, g);
    for (int64_t j = 0; j < N; ++j) g[j] = gg.alpha_of(gg.alpha, j) * g[j] * ir.p[t];
  }
  store(out, 0, r.data(), T * N);
}

// dinv_rms[t] = sum_j alpha(j) g[t,j] h_mix[t,j]
template <class R> void dinv_rms(const Problem& p, const TensorMap& in, const Arith& a, Tensor& out) {
  const int64_t T = p.T(), N = p.N();
  GateGrads<R> gg(p, in, a);
  As<R> hm(dep(in, "h_mix"));
  std::vector<R> al = all_as<R>(dep(in, "alpha")), g(static_cast<size_t>(N)), r(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    gg(t, g.data());
    R s = 0;
    for (int64_t q = 0; q < N; ++q) {
      const int64_t j = step(q, N, a);
      s += gg.alpha_of(al, j) * g[size_t(j)] * hm.p[t * N + j];
    }
    r[size_t(t)] = s;
  }
  store(out, 0, r.data(), T);
}

// dvecX[T,K] = dh_mix[T,N] · phi[N,K]
template <class R> void dvecX(const Problem& p, const TensorMap& in, const Arith& a, Tensor& out) {
  const int64_t T = p.T(), K = p.K(), N = p.N();
  As<R> dhm(dep(in, "dh_mix"));
  std::vector<R> phi = operands(all_as<R>(dep(in, "phi")), a.operands);
  R* o = out.data<R>();
  if (a.plain) {  // one chain over j per (t, k)
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      R* row = o + t * K;
      std::fill(row, row + K, R(0));
      for (int64_t q = 0; q < N; ++q) {
        const int64_t j = step(q, N, a);
        R c = operand(dhm.p[t * N + j], a.operands);
        for (int64_t k = 0; k < K; ++k) row[k] += c * phi[size_t(j * K + k)];
      }
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t t0 = 0; t0 < T; t0 += kTokChunk) {
    int64_t rows = std::min(kTokChunk, T - t0);
    MapM<R>(o + t0 * K, rows, K).noalias() = MapC<R>(dhm.p + t0 * N, rows, N) * MapC<R>(phi.data(), N, K);
  }
}

// dx[t,k] = dvecX[t,k] gamma[k] - dinv_rms[t] inv_rms[t]^3 / K x[t,k] + h_pre[t,i] dh_in[t,d]  (k = i*D+d)
template <class R> void dx(const Problem& p, const TensorMap& in, Tensor& out) {
  const Tensor &x = dep(in, "x"), &dhin = dep(in, "dh_in");
  const int64_t T = p.T(), n = p.n, D = p.D, K = p.K();
  As<R> dv(dep(in, "dvecX")), dir(dep(in, "dinv_rms")), ir(dep(in, "inv_rms")), hp(dep(in, "h_pre"));
  std::vector<R> g = all_as<R>(dep(in, "gamma"));
#pragma omp parallel
  {
    std::vector<R> v(static_cast<size_t>(K)), gi(static_cast<size_t>(D)), r(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      row_as(x, K, t, v.data());
      row_as(dhin, D, t, gi.data());
      R c = dir.p[t] * ir.p[t] * ir.p[t] * ir.p[t] / R(K);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t d = 0; d < D; ++d) {
          int64_t k = i * D + d;
          r[size_t(k)] = dv.p[t * K + k] * g[size_t(k)] - c * v[size_t(k)] + hp.p[t * n + i] * gi[size_t(d)];
        }
      store(out, t * K, r.data(), K);
    }
  }
}

// ---------------------------------------------------------------- sums over tokens
// Each adds the tokens of `p` to `acc`, which is carried from one token chunk to the next
// (TokenSums). The golden sums each kTokenBlock tokens on their own and adds the block to acc
// in order; plain evaluations continue one chain. So a case run in chunks that start at
// multiples of kTokenBlock gives the same bits as the case run in one piece.

// acc[N,K] += sum_t dh_mix[t,:]^T x[t,:]  (gamma applied at the end: dphi = acc ⊙ gamma).
// A plain evaluation with rounded operands rounds x*gamma too (x stays exact where gamma is 1):
// a kernel whose GEMM reads x*gamma (autograd's dh_mix^T (x*gamma)) rounds both of its operands,
// about twice the error of one that applies gamma after the GEMM, and a correct such TF32 kernel
// was diverged at dphi under --accept tf32 (review A, session 23).
template <class R> void dphi_add(const Problem& p, const TensorMap& in, const Arith& a, R* acc) {
  const Tensor& x = dep(in, "x");
  const int64_t T = p.T(), K = p.K(), N = p.N();
  As<R> dhm(dep(in, "dh_mix"));
  const std::vector<R> g = a.plain && a.operands != Operands::exact ? all_as<R>(dep(in, "gamma")) : std::vector<R>();
#pragma omp parallel
  {
    std::vector<R> v(static_cast<size_t>(kTokenBlock * kColSlice));
    Mat<R> s;
#pragma omp for schedule(static)
    for (int64_t k0 = 0; k0 < K; k0 += kColSlice) {
      int64_t w = std::min(kColSlice, K - k0);
      s.resize(N, w);
      for (int64_t j = 0; j < N; ++j)
        for (int64_t c = 0; c < w; ++c) s(j, c) = acc[j * K + k0 + c];
      for (int64_t t0 = 0; t0 < T; t0 += kTokenBlock) {
        int64_t rows = std::min(kTokenBlock, T - t0);
        block_as(x, K, t0, t0 + rows, k0, k0 + w, v.data());
        if (!a.plain) {
          s.noalias() += MapC<R>(dhm.p + t0 * N, rows, N).transpose() * MapC<R>(v.data(), rows, w);
          continue;
        }
        if (!g.empty())  // x*gamma as the GEMM reads it, over gamma, which sum_finish applies again
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t cc = 0; cc < w; ++cc)
              if (R gk = g[size_t(k0 + cc)]; gk != R(0) && std::isfinite(gk)) {
                R& e = v[size_t(r * w + cc)];
                e = operand(e * gk, a.operands) / gk;
              }
        for (int64_t r = 0; r < rows; ++r)  // one chain over tokens per (j, k)
          for (int64_t j = 0; j < N; ++j) {
            R c = operand(dhm.p[(t0 + r) * N + j], a.operands);
            for (int64_t cc = 0; cc < w; ++cc) s(j, cc) += c * v[size_t(r * w + cc)];
          }
      }
      for (int64_t j = 0; j < N; ++j)
        for (int64_t c = 0; c < w; ++c) acc[j * K + k0 + c] = s(j, c);
    }
  }
}

// acc[K] += sum_t x[t,k] dvecX[t,k]
template <class R> void dgamma_add(const Problem& p, const TensorMap& in, const Arith& a, R* acc) {
  const Tensor& x = dep(in, "x");
  const int64_t T = p.T(), K = p.K();
  As<R> dv(dep(in, "dvecX"));
#pragma omp parallel
  {
    std::vector<R> v(static_cast<size_t>(kTokenBlock * kColSlice)), part(static_cast<size_t>(kColSlice));
#pragma omp for schedule(static)
    for (int64_t k0 = 0; k0 < K; k0 += kColSlice) {
      int64_t w = std::min(kColSlice, K - k0);
      for (int64_t t0 = 0; t0 < T; t0 += kTokenBlock) {
        int64_t rows = std::min(kTokenBlock, T - t0);
        R* s = a.plain ? acc + k0 : part.data();
        if (!a.plain) std::fill(part.begin(), part.end(), R(0));
        block_as(x, K, t0, t0 + rows, k0, k0 + w, v.data());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < w; ++c) s[c] += v[size_t(r * w + c)] * dv.p[(t0 + r) * K + k0 + c];
        if (!a.plain)
          for (int64_t c = 0; c < w; ++c) acc[k0 + c] += part[size_t(c)];
      }
    }
  }
}

// acc[m] += sum_t per[t,m] for per [T,M]: pairwise within each block of tokens, the block added
// to acc (plain: one chain over every token, continued from acc)
template <class R> void add_over_tokens(const std::vector<R>& per, int64_t T, int64_t M, const Arith& a, R* acc) {
  for (int64_t m = 0; m < M; ++m) {
    if (a.plain) {
      for (int64_t t = 0; t < T; ++t) acc[m] += per[size_t(t * M + m)];
      continue;
    }
    for (int64_t t0 = 0; t0 < T; t0 += kTokenBlock)
      acc[m] += pairwise_sum(per.data() + t0 * M + m, std::min(kTokenBlock, T - t0), M);
  }
}

// dalpha's per-token terms [T,3]: [g_pre·t_pre, g_post·t_post, g_res·t_res], t = h_mix·inv_rms
template <class R> std::vector<R> dalpha_terms(const Problem& p, const TensorMap& in, const Arith& a) {
  const int64_t T = p.T(), N = p.N(), n = p.n;
  GateGrads<R> gg(p, in, a);
  As<R> hm(dep(in, "h_mix")), ir(dep(in, "inv_rms"));
  std::vector<R> per(static_cast<size_t>(T * 3)), g(static_cast<size_t>(N));
  for (int64_t t = 0; t < T; ++t) {
    gg(t, g.data());
    R s[3] = {0, 0, 0};
    for (int64_t j = 0; j < N; ++j) s[j < n ? 0 : j < 2 * n ? 1 : 2] += g[size_t(j)] * hm.p[t * N + j] * ir.p[t];
    for (int k = 0; k < 3; ++k) per[size_t(t * 3 + k)] = s[k];
  }
  return per;
}

// dbias's per-token terms [T,N]: g
template <class R> std::vector<R> dbias_terms(const Problem& p, const TensorMap& in, const Arith& a) {
  const int64_t T = p.T(), N = p.N();
  GateGrads<R> gg(p, in, a);
  std::vector<R> per(static_cast<size_t>(T * N));
  for (int64_t t = 0; t < T; ++t) gg(t, &per[size_t(t * N)]);
  return per;
}

// [T,M] per-token terms of dalpha (M = 3) or dbias (M = N)
template <class R> std::vector<R> token_terms(const std::string& s, const Problem& p, const TensorMap& in, const Arith& a) {
  if (s == "dalpha") return dalpha_terms<R>(p, in, a);
  if (s == "dbias") return dbias_terms<R>(p, in, a);
  MHC_CHECK(false, "no per-token terms for stage ", s);
  return {};
}

template <class R> void sum_add(const std::string& s, const Problem& p, const TensorMap& in, const Arith& a, R* acc) {
  if (s == "dphi") return dphi_add<R>(p, in, a, acc);
  if (s == "dgamma") return dgamma_add<R>(p, in, a, acc);
  MHC_CHECK(has_token_terms(s), "no sum over tokens for stage ", s);
  add_over_tokens(token_terms<R>(s, p, in, a), p.T(), s == "dalpha" ? 3 : p.N(), a, acc);  // [T,M] terms
}

// The stage from its accumulated sum: dphi takes gamma here, the others are the sum itself.
template <class R> void sum_finish(const std::string& s, const Problem& p, const TensorMap& in, const R* acc, Tensor& out) {
  const int64_t size = out.size();
  std::vector<R> r(acc, acc + size);
  if (s == "dphi") {
    std::vector<R> g = all_as<R>(dep(in, "gamma"));
    const int64_t K = p.K();
    for (int64_t i = 0; i < size; ++i) r[size_t(i)] *= g[size_t(i % K)];
  }
  store(out, 0, r.data(), size);
}

template <class R> void compute(const std::string& s, const Problem& p, const TensorMap& in, const Arith& a, Tensor& out) {
  if (s == "inv_rms") return inv_rms<R>(p, in, a, out);
  if (s == "h_mix") return h_mix<R>(p, in, a, out);
  if (s == "h_pre" || s == "h_post" || s == "h_res") return gate<R>(stage(s).name, p, in, out);
  if (s == "h_in") return h_in<R>(p, in, a, out);
  if (s == "dh_pre") return dh_pre<R>(p, in, a, out);
  if (s == "dh_mix") return dh_mix<R>(p, in, a, out);
  if (s == "dinv_rms") return dinv_rms<R>(p, in, a, out);
  if (s == "dvecX") return dvecX<R>(p, in, a, out);
  if (s == "dx") return dx<R>(p, in, out);
  if (is_token_sum(s)) {
    std::vector<R> acc(static_cast<size_t>(out.size()), R(0));
    sum_add<R>(s, p, in, a, acc.data());
    return sum_finish<R>(s, p, in, acc.data(), out);
  }
  MHC_CHECK(false, "no CPU function for stage ", s);
}

}  // namespace

Tensor as_operand(const Tensor& t, Operands o, const Tensor* scale) {
  Tensor r(t.shape, DType::f64);
  double* p = r.data<double>();
  const int64_t m = scale ? std::max<int64_t>(scale->size(), 1) : 1;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < t.size(); ++i) {
    const double s = scale && scale->size() ? scale->at(i % m) : 1;
    p[i] = s == 0 ? t.at(i) : double(operand(float(t.at(i) * s), o)) / s;
  }
  return r;
}

void cpu_stage_into(const std::string& name, const Problem& p, const TensorMap& in, Arith a, Tensor& out) {
  const Stage& s = stage(name);
  MHC_CHECK(!a.plain || a.prec == Precision::fp32, "plain evaluations are fp32");
  Shape shape = stage_shape(s, p);
  DType dt = a.plain ? DType::f32 : stored_dtype(s, a.prec);
  if (out.shape != shape || out.dtype != dt) out = Tensor(shape, dt);
  a.prec == Precision::fp32 ? compute<float>(name, p, in, a, out) : compute<double>(name, p, in, a, out);
}

Tensor cpu_stage(const std::string& name, const Problem& p, const TensorMap& in, Arith a) {
  Tensor out;
  cpu_stage_into(name, p, in, a, out);
  return out;
}

bool has_token_terms(const std::string& name) { return name == "dalpha" || name == "dbias"; }

std::vector<double> cpu_token_terms(const std::string& name, const Problem& p, const TensorMap& in, Arith a) {
  if (a.prec == Precision::fp64) return token_terms<double>(name, p, in, a);
  std::vector<float> f = token_terms<float>(name, p, in, a);
  return std::vector<double>(f.begin(), f.end());
}

void cpu_run_chunk(Case& c, Arith a, TokenSums& sums, Pass pass) {
  for (const Stage& s : stage_table()) {
    bool want = s.group == Group::forward ? pass != Pass::bwd
                : s.group == Group::backward ? pass != Pass::fwd && c.has_gradients()
                                             : false;
    if (!want) continue;
    if (!is_token_sum(s)) {
      cpu_stage_into(s.name, c.prob, c.t, a, c.t[s.name]);  // reuses the tensor's memory
      continue;
    }
    Tensor& acc = sums.acc[s.name];
    if (acc.bytes.empty()) {
      acc = Tensor(stage_shape(s, c.prob), a.prec == Precision::fp32 ? DType::f32 : DType::f64);
      std::fill(acc.bytes.begin(), acc.bytes.end(), uint8_t(0));
    }
    a.prec == Precision::fp32 ? sum_add<float>(s.name, c.prob, c.t, a, acc.data<float>())
                              : sum_add<double>(s.name, c.prob, c.t, a, acc.data<double>());
  }
  c.attrs["backend"] = "cpu";
  c.attrs["precision"] = precision_name(a.prec);
}

void cpu_finish(Case& c, const TokenSums& sums, Arith a) {
  for (auto& [name, acc] : sums.acc) {
    const Stage& s = stage(name);
    Tensor& out = c.t[name];
    DType dt = a.plain ? DType::f32 : stored_dtype(s, a.prec);
    if (out.shape != acc.shape || out.dtype != dt) out = Tensor(acc.shape, dt);
    a.prec == Precision::fp32 ? sum_finish<float>(name, c.prob, c.t, acc.data<float>(), out)
                              : sum_finish<double>(name, c.prob, c.t, acc.data<double>(), out);
  }
}

void cpu_run(Case& c, Arith a, Pass pass) {
  TokenSums sums;
  cpu_run_chunk(c, a, sums, pass);
  cpu_finish(c, sums, a);
}

}  // namespace mhc

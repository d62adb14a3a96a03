/// \file element.cuh
/// \brief The element types of Q, K, V and O on the device (float, __half,
/// __nv_bfloat16) for kernels that load and store any of them and compute in
/// fp32: widening loads, rounding stores, and the host-side switch from a
/// DType to the kernel instance of that type. Include from .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <utility>

#include "error.h"
#include "problem.h"

namespace flashstep {

/// Calls `fn` with a value of the C++ element type of `dtype` (float, __half
/// or __nv_bfloat16), so a launcher picks its kernel instance by type:
///   with_element_type(p.dtype, [&](auto elem) { using Elem = decltype(elem); ... });
template <typename Fn>
void with_element_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFp32: std::forward<Fn>(fn)(float{}); return;
    case DType::kFp16: std::forward<Fn>(fn)(__half{}); return;
    case DType::kBf16: std::forward<Fn>(fn)(__nv_bfloat16{}); return;
  }
  throw Error("with_element_type: unknown element type");
}

/// An element widened to fp32 (exact).
inline __device__ float to_float(float x) { return x; }
inline __device__ float to_float(__half x) { return __half2float(x); }
inline __device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

/// An fp32 value rounded to the element type (to nearest, ties to even).
template <typename Elem>
__device__ Elem from_float(float x);
template <>
inline __device__ float from_float<float>(float x) {
  return x;
}
template <>
inline __device__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
inline __device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// Four consecutive 16-bit elements as one 8-byte access.
template <typename Pair>
struct alignas(2 * sizeof(Pair)) FourOf {
  Pair lo, hi;
};

/// src[0..3] widened to fp32, in one access: 16 bytes in fp32, 8 in
/// fp16/bf16. src must be aligned to that size.
inline __device__ float4 load_vec4(const float* src) {
  return *reinterpret_cast<const float4*>(src);
}
inline __device__ float4 load_vec4(const __half* src) {
  const FourOf<__half2> v = *reinterpret_cast<const FourOf<__half2>*>(src);
  const float2 lo = __half22float2(v.lo), hi = __half22float2(v.hi);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
inline __device__ float4 load_vec4(const __nv_bfloat16* src) {
  const FourOf<__nv_bfloat162> v = *reinterpret_cast<const FourOf<__nv_bfloat162>*>(src);
  const float2 lo = __bfloat1622float2(v.lo), hi = __bfloat1622float2(v.hi);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

/// dst[0..3] = v rounded to the element type, in one access (aligned as for
/// load_vec4).
inline __device__ void store_vec4(float* dst, float4 v) { *reinterpret_cast<float4*>(dst) = v; }
inline __device__ void store_vec4(__half* dst, float4 v) {
  *reinterpret_cast<FourOf<__half2>*>(dst) = {__floats2half2_rn(v.x, v.y),
                                              __floats2half2_rn(v.z, v.w)};
}
inline __device__ void store_vec4(__nv_bfloat16* dst, float4 v) {
  *reinterpret_cast<FourOf<__nv_bfloat162>*>(dst) = {__floats2bfloat162_rn(v.x, v.y),
                                                     __floats2bfloat162_rn(v.z, v.w)};
}

}  // namespace flashstep

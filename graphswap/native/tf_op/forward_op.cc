// GraphswapForward: a TensorFlow op that runs a swapped layer's forward pass by calling an
// operation-level kernel library (graphswap_kernels.h: graphswap_matmul_f32 /
// graphswap_conv2d_f32) or graphswap's fused table-driven kernels (graphswap_lut_matmul_f32 /
// graphswap_lut_conv2d_f32: quantize, table products, corrections, dequantize), then
// graphswap_channel_affine_f32 for output gain / bias / ReLU, directly from TensorFlow's
// executor thread.  It replaces tf.numpy_function for those kernels:
// no Python, no GIL, no array conversions on every call.
//
// What to call is not an attribute of the graph: Python registers a ForwardCall (function
// addresses taken from the libraries it loaded, the convolution geometry, a multiplier table and
// its resolved quantization scheme) and puts only the returned handle in the node.  A handle carries a random per-process token, so a graph traced in
// another process (a serialized GraphDef) fails with a clear error instead of calling addresses
// that mean nothing here.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "graphswap_kernels.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using MatmulFn = int32_t (*)(const float*, const float*, float*, int64_t, int64_t, int64_t);
using ConvFn = int32_t (*)(const float*, const float*, float*, const graphswap_conv2d_params*);
using AffineFn = int32_t (*)(float*, int64_t, int64_t, const float*, const float*, int32_t);
using LastErrorFn = const char* (*)();
using LutMatmulFn = int32_t (*)(const float*, const float*, const float*, float*, int64_t, int64_t,
                                int64_t, const int32_t*, const graphswap_lut_quant*);
using LutConvFn = int32_t (*)(const float*, const float*, const float*, float*, const int32_t*,
                              const graphswap_lut_quant*, const graphswap_conv2d_params*);

// kConvBackpropInput: a Conv2DTranspose through graphswap_conv2d_backprop_input_f32 (conv2d holds
// its address): x is the transposed convolution's input (the forward convolution's output, conv
// its geometry), w the Keras kernel (its HWIO filter), the result the forward convolution's input.
// kLutConvBackpropInput: the same through graphswap_lut_conv2d_backprop_input_f32 (a factored
// table's transposed convolution).
enum ForwardKind : int32_t {
  kMatmul = 0, kConv2D = 1, kLutMatmul = 2, kLutConv2D = 3, kConvBackpropInput = 4,
  kLutConvBackpropInput = 5
};

// Field order is the ABI shared with graphswap/swap/forward_op.py (its ctypes mirror).
struct ForwardCall {
  int32_t kind;
  int32_t has_gain, has_shift, relu;
  void* matmul;      // kMatmul: the library's graphswap_matmul_f32; kLutMatmul: lut_matmul_f32
  void* conv2d;      // kConv2D: the library's graphswap_conv2d_f32; kLutConv2D: lut_conv2d_f32
  void* last_error;  // that library's graphswap_last_error, or null
  void* affine;      // graphswap's own graphswap_channel_affine_f32 (epilogue), or null
  graphswap_conv2d_params conv;  // batch is the input's, per call
  char library[256];             // the arithmetic library's file name, for error messages
  const int32_t* table;          // kLut*: the multiplier's 65536-entry table (kept by Python)
  graphswap_lut_quant quant;     // kLut*: the resolved scheme (static scale from the range input)
  int32_t has_range;             // kLut*: a static activation range [lo, hi] is the first extra
  // A Conv2DTranspose's sub-pixel phases merged into one convolution (graphswap/swap/
  // ops_transposed.py): w is then the Keras kernel (h, w, filters, in) and the op builds the
  // merged HWIO filter itself - entry i is value filter_index[i] of w's kernel_size values
  // followed by one zero and the weight-range values [range_channels][filters] (each filter's
  // finite minimum and maximum, non-finite values counted as 0, and NaN where it has a
  // non-finite value: what a table-driven phase carries on range_channels extra input channels
  // of zeros, appended to x here).  The merged output (n, conv.out_height, conv.out_width,
  // stride_h * stride_w * filters) is written interleaved (depth to space): block b of phase
  // (r_h, r_w) from merged position b + shift to output position b * stride + r of the
  // (n, out_height, out_width, filters) result; gain, shift and ReLU apply to that.
  const int32_t* filter_index;  // null: an ordinary call
  int64_t filter_size, kernel_size;
  int32_t range_channels, filters, stride_h, stride_w, shift_h, shift_w, out_height, out_width;
};

// graphswap.kernels.quantized.fused_quant's static scale and zero point of the range [lo, hi],
// the same double operations in the same order (so the codes are bit for bit those of Python).
void static_scale(const float* range, graphswap_lut_quant* quant) {
  double lo = range[0], hi = range[1];
  quant->activation_mode = GRAPHSWAP_QUANT_STATIC;
  // N-bit activations of an Nx8 multiplier: weight_bits' second byte (graphswap_kernels.h)
  const int abits = (quant->weight_bits >> 8) & 0xff;
  const bool narrow = abits >= 1 && abits <= 7;
  const double levels = narrow ? static_cast<double>((1 << abits) - 1) : 255.0;
  const double limit = narrow ? static_cast<double>((1 << (abits - 1)) - 1) : 127.0;
  if (quant->scheme == GRAPHSWAP_LUT_SIGNED) {
    const double amax = std::max(std::fabs(lo), std::fabs(hi));
    quant->activation_scale = amax > 0 ? amax / limit : 1.0;  // std::max keeps NaN as max() does
    quant->activation_zero_point = 0;
    return;
  }
  // a signed multiplier's unsigned codes (QuantScheme.activation_zero_point -128): the range
  // [0, hi], zero point 0 - fused_quant's asymmetric_params(0, hi, 255)
  if (quant->scheme == GRAPHSWAP_LUT_SIGNED_UNSIGNED_ACTIVATIONS) lo = 0.0;
  lo = std::isnan(lo) ? lo : std::min(lo, 0.0);  // np.minimum / np.maximum propagate NaN
  hi = std::isnan(hi) ? hi : std::max(hi, 0.0);
  if (hi == lo) {
    quant->activation_scale = 1.0;
    quant->activation_zero_point = 0;
    return;
  }
  const double scale = (hi - lo) / levels;
  double zero = std::nearbyint(-lo / scale);  // np.rint: round half to even
  zero = zero < 0 ? 0 : (zero > levels ? levels : zero);
  quant->activation_scale = scale;
  quant->activation_zero_point = std::isnan(zero) ? 0 : static_cast<int32_t>(zero);
}

const char* error_name(int32_t code) {
  switch (code) {
    case GRAPHSWAP_ERR_INVALID_ARGUMENT: return "invalid argument";
    case GRAPHSWAP_ERR_OUT_OF_MEMORY: return "out of memory";
    case GRAPHSWAP_ERR_OVERFLOW: return "overflow";
    case GRAPHSWAP_ERR_UNSUPPORTED: return "unsupported";
    case GRAPHSWAP_ERR_INTERNAL: return "internal";
    default: return "unknown code";
  }
}

std::mutex registry_mutex;
std::deque<ForwardCall> registry;  // never shrinks: handles stay valid for the process
const int64_t process_token = [] {
  std::random_device device;
  return static_cast<int64_t>(device() & 0x7fffffffu);
}();

bool lookup(int64_t handle, ForwardCall* out) {
  if ((handle >> 32) != process_token) return false;
  std::lock_guard<std::mutex> lock(registry_mutex);
  const uint64_t index = static_cast<uint64_t>(handle & 0xffffffffu);
  if (index >= registry.size()) return false;
  *out = registry[index];
  return true;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int64_t graphswap_forward_register(
    const ForwardCall* call) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry.push_back(*call);
  return (process_token << 32) | static_cast<int64_t>(registry.size() - 1);
}

extern "C" __attribute__((visibility("default"))) int32_t graphswap_forward_abi(void) {
  return static_cast<int32_t>(sizeof(ForwardCall));
}

namespace tensorflow {

REGISTER_OP("GraphswapForward")
    .Input("x: float")
    .Input("w: float")
    .Input("extras: n_extras * float")
    .Output("y: float")
    .Attr("handle: int")
    .Attr("n_extras: int >= 0")
    .SetShapeFn(shape_inference::UnknownShape)
    .Doc("A graphswap swapped layer's forward pass through its kernel library (extras: the "
         "static activation range, output gain, shift - those the registered call has).");

class GraphswapForwardOp : public OpKernel {
 public:
  explicit GraphswapForwardOp(OpKernelConstruction* context) : OpKernel(context) {
    int64_t handle = 0;
    OP_REQUIRES_OK(context, context->GetAttr("handle", &handle));
    OP_REQUIRES(context, lookup(handle, &call_),
                errors::FailedPrecondition(
                    "GraphswapForward handle ", handle, " was not registered in this process: ",
                    "the graph was built in another process. Rebuild it from the Keras model "
                    "(graphswap swapped layers re-create their ops when loaded)"));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& w = context->input(1);
    TensorShape out_shape;
    int64_t rows = 0, channels = 0;
    const bool matmul = call_.kind == kMatmul || call_.kind == kLutMatmul;
    if (matmul) {
      OP_REQUIRES(context, x.dims() == 2 && w.dims() == 2 && x.dim_size(1) == w.dim_size(0),
                  errors::InvalidArgument("GraphswapForward matmul: shapes ",
                                          x.shape().DebugString(), " x ", w.shape().DebugString(),
                                          " do not agree"));
      rows = x.dim_size(0);
      channels = w.dim_size(1);
      out_shape = TensorShape({rows, channels});
    } else if (call_.kind == kConvBackpropInput || call_.kind == kLutConvBackpropInput) {
      const graphswap_conv2d_params& p = call_.conv;
      OP_REQUIRES(context,
                  x.dims() == 4 && x.dim_size(1) == p.out_height && x.dim_size(2) == p.out_width &&
                      x.dim_size(3) == p.out_channels && w.dims() == 4 &&
                      w.dim_size(0) == p.filter_height && w.dim_size(1) == p.filter_width &&
                      w.dim_size(2) == p.in_channels && w.dim_size(3) == p.out_channels,
                  errors::InvalidArgument("GraphswapForward transposed conv: input ",
                                          x.shape().DebugString(), " and kernel ",
                                          w.shape().DebugString(),
                                          " differ from the traced geometry"));
      rows = x.dim_size(0) * p.in_height * p.in_width;
      channels = p.in_channels;
      out_shape = TensorShape({x.dim_size(0), p.in_height, p.in_width, p.in_channels});
    } else if (call_.filter_index != nullptr) {
      const graphswap_conv2d_params& p = call_.conv;
      OP_REQUIRES(context,
                  x.dims() == 4 && x.dim_size(1) == p.in_height && x.dim_size(2) == p.in_width &&
                      x.dim_size(3) == p.in_channels - call_.range_channels &&
                      w.NumElements() == call_.kernel_size,
                  errors::InvalidArgument("GraphswapForward merged transposed conv: input ",
                                          x.shape().DebugString(), " and kernel ",
                                          w.shape().DebugString(),
                                          " differ from the traced geometry"));
      rows = x.dim_size(0) * call_.out_height * call_.out_width;
      channels = call_.filters;
      out_shape = TensorShape({x.dim_size(0), call_.out_height, call_.out_width, call_.filters});
    } else {
      const graphswap_conv2d_params& p = call_.conv;
      OP_REQUIRES(context,
                  x.dims() == 4 && x.dim_size(1) == p.in_height && x.dim_size(2) == p.in_width &&
                      x.dim_size(3) == p.in_channels && w.dims() == 4 &&
                      w.dim_size(0) == p.filter_height && w.dim_size(1) == p.filter_width &&
                      w.dim_size(3) == p.out_channels,
                  errors::InvalidArgument("GraphswapForward conv2d: input ",
                                          x.shape().DebugString(), " and filter ",
                                          w.shape().DebugString(),
                                          " differ from the traced geometry"));
      rows = x.dim_size(0) * p.out_height * p.out_width;
      channels = p.out_channels;
      out_shape = TensorShape({x.dim_size(0), p.out_height, p.out_width, p.out_channels});
    }
    // the extra inputs, in this order: static range (kLut*), gain, shift
    const float* extras[3] = {nullptr, nullptr, nullptr};
    const int64_t sizes[3] = {2, channels, channels};
    const int32_t present[3] = {call_.has_range, call_.has_gain, call_.has_shift};
    static const char* const names[3] = {"activation range", "gain", "shift"};
    int input = 2;
    for (int which = 0; which < 3; ++which) {
      if (!present[which]) continue;
      const Tensor& v = context->input(input++);
      OP_REQUIRES(context, v.NumElements() == sizes[which],
                  errors::InvalidArgument("GraphswapForward: ", names[which], " has ",
                                          v.NumElements(), " values, expected ", sizes[which]));
      extras[which] = v.flat<float>().data();
    }
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, out_shape, &y));
    if (y->NumElements() == 0) return;
    const float* xs = x.flat<float>().data();
    const float* ws = w.flat<float>().data();
    float* ys = y->flat<float>().data();
    graphswap_conv2d_params params = call_.conv;
    params.batch = x.dim_size(0);
    Tensor merged_filter, merged_input, merged_output;
    if (call_.filter_index != nullptr) {
      OP_REQUIRES_OK(context, merge_operands(context, x, ws, &merged_filter, &merged_input));
      OP_REQUIRES_OK(context, context->allocate_temp(
          DT_FLOAT, TensorShape({x.dim_size(0), params.out_height, params.out_width,
                                 params.out_channels}), &merged_output));
      ws = merged_filter.flat<float>().data();
      if (call_.range_channels > 0) xs = merged_input.flat<float>().data();
      ys = merged_output.flat<float>().data();
    }
    int32_t code = 0;
    const char* function = "";
    if (call_.kind == kMatmul) {
      function = "graphswap_matmul_f32";
      code = reinterpret_cast<MatmulFn>(call_.matmul)(xs, ws, ys, rows, x.dim_size(1), channels);
    } else if (call_.kind == kConv2D) {
      function = "graphswap_conv2d_f32";
      code = reinterpret_cast<ConvFn>(call_.conv2d)(xs, ws, ys, &params);
    } else if (call_.kind == kConvBackpropInput) {
      function = "graphswap_conv2d_backprop_input_f32";
      code = reinterpret_cast<ConvFn>(call_.conv2d)(xs, ws, ys, &params);
    } else if (x.NumElements() == 0 || w.NumElements() == 0) {
      std::fill(ys, ys + y->NumElements(), 0.0f);  // no products: the numpy path's zero sums
    } else {
      graphswap_lut_quant quant = call_.quant;
      if (call_.has_range) static_scale(extras[0], &quant);
      if (call_.kind == kLutMatmul) {
        function = "graphswap_lut_matmul_f32";
        code = reinterpret_cast<LutMatmulFn>(call_.matmul)(xs, ws, nullptr, ys, rows,
                                                           x.dim_size(1), channels, call_.table,
                                                           &quant);
      } else if (call_.kind == kLutConvBackpropInput) {
        function = "graphswap_lut_conv2d_backprop_input_f32";
        code = reinterpret_cast<LutConvFn>(call_.conv2d)(xs, ws, nullptr, ys, call_.table, &quant,
                                                         &params);
      } else {
        function = "graphswap_lut_conv2d_f32";
        code = reinterpret_cast<LutConvFn>(call_.conv2d)(xs, ws, nullptr, ys, call_.table, &quant,
                                                         &params);
      }
    }
    OP_REQUIRES(context, code == 0, library_error(code, function));
    if (call_.filter_index != nullptr) {
      ys = y->flat<float>().data();
      interleave(merged_output.flat<float>().data(), x.dim_size(0), params, ys);
    }
    if (call_.affine == nullptr) return;
    code = reinterpret_cast<AffineFn>(call_.affine)(ys, rows, channels, extras[1], extras[2],
                                                    call_.relu);
    OP_REQUIRES(context, code == 0,
                errors::Internal("kernel graphswap_channel_affine_f32 failed with code ", code,
                                 " (", error_name(code), ")"));
  }

 private:
  // The merged filter from the Keras kernel w (and its weight-range values), and the input with
  // range_channels zero channels appended (ForwardCall's comment).
  Status merge_operands(OpKernelContext* context, const Tensor& x, const float* w,
                        Tensor* filter, Tensor* input) const {
    const int64_t values = call_.kernel_size, filters = call_.filters;
    const int64_t extra = call_.range_channels;
    std::vector<float> source(values + 1 + extra * filters, 0.0f);
    std::copy(w, w + values, source.begin());
    if (extra > 0) {
      const int64_t channels = call_.conv.in_channels - extra;
      const int64_t taps = values / (filters * channels);
      for (int64_t f = 0; f < filters; ++f) {
        float lo = 0.0f, hi = 0.0f, mark = 0.0f;
        bool first = true;
        for (int64_t t = 0; t < taps; ++t)
          for (int64_t c = 0; c < channels; ++c) {
            float v = w[(t * filters + f) * channels + c];
            if (!std::isfinite(v)) v = 0.0f, mark = NAN;
            lo = first ? v : std::min(lo, v);
            hi = first ? v : std::max(hi, v);
            first = false;
          }
        float* range = source.data() + values + 1;
        range[f] = lo, range[filters + f] = hi;
        if (extra > 2) range[2 * filters + f] = mark;
      }
    }
    TF_RETURN_IF_ERROR(context->allocate_temp(DT_FLOAT, TensorShape({call_.filter_size}), filter));
    float* merged = filter->flat<float>().data();
    for (int64_t i = 0; i < call_.filter_size; ++i) merged[i] = source[call_.filter_index[i]];
    if (extra == 0) return Status();
    const int64_t pixels = x.NumElements() / x.dim_size(3), c_in = x.dim_size(3);
    TF_RETURN_IF_ERROR(context->allocate_temp(
        DT_FLOAT, TensorShape({x.dim_size(0), x.dim_size(1), x.dim_size(2), c_in + extra}), input));
    const float* from = x.flat<float>().data();
    float* to = input->flat<float>().data();
    for (int64_t q = 0; q < pixels; ++q) {
      std::copy(from + q * c_in, from + (q + 1) * c_in, to + q * (c_in + extra));
      std::fill(to + q * (c_in + extra) + c_in, to + (q + 1) * (c_in + extra), 0.0f);
    }
    return Status();
  }

  // Depth to space: the merged output's phase channels to their output positions.  For one
  // output row, merged pixel b's phases (r_h, 0 .. s_w - 1) are s_w * filters contiguous values
  // that become s_w adjacent output pixels: one short copy each, in a loop the compiler inlines
  // (std::copy called per pixel cost more than the copy for a few channels).
  void interleave(const float* merged, int64_t batch, const graphswap_conv2d_params& p,
                  float* out) const {
    const int64_t f = call_.filters, s_h = call_.stride_h, s_w = call_.stride_w;
    const int64_t oh_n = call_.out_height, ow_n = call_.out_width;
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t oh = 0; oh < oh_n; ++oh) {
        const int64_t row = n * p.out_height + oh / s_h + call_.shift_h, r_h = oh % s_h;
        float* dst = out + (n * oh_n + oh) * ow_n * f;
        for (int64_t ow = 0; ow < ow_n; ow += s_w) {
          const float* src = merged + ((row * p.out_width + ow / s_w + call_.shift_w) *
                                           p.out_channels + r_h * s_w * f);
          const int64_t count = std::min(s_w, ow_n - ow) * f;
          float* to = dst + ow * f;
          for (int64_t i = 0; i < count; ++i) to[i] = src[i];
        }
      }
  }

  // The same words as graphswap.native.KernelLibrary's errors on the numpy_function path.
  Status library_error(int32_t code, const char* function) const {
    std::string message;
    if (call_.last_error != nullptr) {
      const char* text = reinterpret_cast<LastErrorFn>(call_.last_error)();
      if (text != nullptr) message = text;
    }
    return errors::Internal("kernel ", function, " in ", call_.library, " failed with code ",
                            code, " (", error_name(code), ")", message.empty() ? "" : ": ",
                            message);
  }

  ForwardCall call_;
};

REGISTER_KERNEL_BUILDER(Name("GraphswapForward").Device(DEVICE_CPU), GraphswapForwardOp);

}  // namespace tensorflow

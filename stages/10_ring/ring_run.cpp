// flashstep_ring's run (ring_cli.h: ring_main): parse, then the model, or the
// ring on the GPUs checked against the fp64 reference and timed. Built with
// FLASHSTEP_HAVE_NCCL = 1 where CMake found NCCL; without it, the run says in
// one line that the stage is unavailable, and `model` still works.
#include <cmath>
#include <new>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/device.h"
#include "common/error.h"
#include "ring_cli.h"
#include "ring_model.h"

#if FLASHSTEP_HAVE_NCCL
#include <algorithm>
#include <utility>

#include "ring_runner.h"
#endif

namespace flashstep::ring {

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

#if FLASHSTEP_HAVE_NCCL
constexpr double kTera = 1e12;
constexpr double kMsPerS = 1e3;
constexpr double kPercent = 100.0;

// The ranks the run uses: --gpus, or every visible GPU; an Error when there
// are too few.
int ranks_to_use(const RingOptions& o) {
  const int visible = visible_gpus();
  if (o.gpus == 0) {
    if (visible < 2) {
      throw Error("ring attention needs at least 2 GPUs and " + std::to_string(visible) +
                  " is visible; pass --gpus 1 for the one-GPU baseline");
    }
    return visible;
  }
  if (o.gpus > visible) {
    throw Error("--gpus " + std::to_string(o.gpus) + ": only " + std::to_string(visible) +
                " GPU" + (visible == 1 ? " is" : "s are") + " visible");
  }
  return o.gpus;
}

int run_ring(const RingOptions& o, const Stage& stage, const Problem& p, std::ostream& out,
             std::ostream& err) {
  using namespace cli;
  std::string why;
  if (!cuda_device_available(&why)) {
    err << "flashstep_ring: no usable CUDA device (" << why << ")\n";
    return kExitFailed;
  }
  const Schedule s(p.Nq, ranks_to_use(o), o.assign, p.causal);
  const Inputs in = random_inputs(p, o.seed);
  ForwardTruth truth;
  if (o.check) {
    const std::int64_t step = check_row_step(p, s);
    err << "flashstep_ring: fp64 reference"
        << (p.dtype == DType::kFp32 ? std::string()
                                     : " from the inputs rounded to " +
                                           std::string(dtype_name(p.dtype)))
        << (step > 1 ? " on one query row in " + std::to_string(step) : std::string())
        << "...\n";
    truth = forward_truth(p, in, step);
  }
  err << "flashstep_ring: " << s.ranks() << " GPU(s), " << assign_name(s.assign()) << ", "
      << stage.name << " (" << dtype_name(p.dtype) << ")...\n";
  RingRun run(p, s, stage, o.overlap, in);
  std::vector<float> O, L;
  run.run(O, L);
  std::string status = "unchecked";
  std::optional<ForwardCheck> check;
  if (o.check) {
    check = check_forward(p, O.data(), L.data(), truth);
    status = check->ok() ? "ok" : check->O.checked == 0 ? "unchecked" : "FAIL";
    if (status == "FAIL") {
      err << "flashstep_ring: differs from the fp64 reference: " << check->summary() << "\n";
    }
  }
  RingTiming timing;
  if (o.iterations > 0) timing = run.time(o.warmup, o.iterations);
  const std::vector<std::int64_t> sent = run.bytes_sent();
  const bool timed = timing.time.iterations > 0;
  const double nan = std::nan("");
  const double tflops = timed ? p.forward_flops() / (timing.time.median_ms / kMsPerS) / kTera : nan;
  const auto [min_compute, max_compute] =
      timing.compute_ms.empty() ? std::pair{nan, nan}
                                : std::pair{*std::min_element(timing.compute_ms.begin(),
                                                              timing.compute_ms.end()),
                                            *std::max_element(timing.compute_ms.begin(),
                                                              timing.compute_ms.end())};
  const DeviceInfo dev = device_info();
  Report r;
  r.title = p.describe() + " on " + std::to_string(s.ranks()) + "x " + dev.name +
            "; TFLOP/s counts 4*B*H*N^2*d (halved if causal); sent = K and V bytes a GPU "
            "sends; hidden = share of the transfers' time the GPU was computing";
  r.columns = {"stage", "dtype", "gpus", "assign", "overlap", "check", "max err O", "max err L",
               "median ms", "p20 ms", "p80 ms", "TFLOP/s", "TFLOP/s per GPU", "sent per GPU",
               "comm ms", "hidden %", "compute ms min", "compute ms max",
               ".B", ".H", ".Nq", ".Nk", ".d", ".causal", ".gpu"};
  r.rows.push_back(
      {text(std::string(stage.name)), text(std::string(dtype_name(p.dtype))), integer(s.ranks()),
       text(std::string(assign_name(s.assign()))), text(o.overlap ? "yes" : "no"), text(status),
       number(check ? check->O.max_abs_error : nan, 2),
       number(check && check->L ? check->L->max_abs_error : nan, 2),
       number(timed ? timing.time.median_ms : nan), number(timed ? timing.time.p20_ms : nan),
       number(timed ? timing.time.p80_ms : nan), number(tflops, 4), number(tflops / s.ranks(), 4),
       bytes(*std::max_element(sent.begin(), sent.end())), number(timed ? timing.comm_ms : nan),
       number(timed ? kPercent * timing.hidden : nan, 3), number(min_compute),
       number(max_compute), integer(p.B), integer(p.H), integer(p.Nq), integer(p.Nk),
       integer(p.d), integer(p.causal ? 1 : 0), text(dev.name)});
  print(r, o.format, out);
  return status == "FAIL" ? kExitFailed : kExitOk;
}
#endif

int execute(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  RingOptions o;
  try {
    o = parse_ring_args(args);
  } catch (const Error& e) {
    err << "flashstep_ring: " << e.what() << "\n";
    return kExitUsage;
  }
  if (o.mode == Mode::kHelp) {
    out << ring_usage();
    return kExitOk;
  }
  const Stage& stage = partial_stage(o);
  const Problem p = typed_problem(o, stage);
  if (o.mode == Mode::kModel) {
    print(model_report(p, Schedule(p.Nq, o.gpus, o.assign, p.causal), stage), o.format, out);
    return kExitOk;
  }
#if FLASHSTEP_HAVE_NCCL
  return run_ring(o, stage, p, out, err);
#else
  err << "flashstep_ring: stage 10 is unavailable: this build found no NCCL (reconfigure with "
         "NCCL_ROOT set to NCCL's prefix); `flashstep_ring model` still works\n";
  return kExitFailed;
#endif
}

}  // namespace

int ring_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  int code = kExitFailed;
  try {
    code = execute(args, out, err);
  } catch (const std::bad_alloc&) {
    err << "flashstep_ring: out of host memory\n";
    return kExitFailed;
  } catch (const std::exception& e) {
    err << "flashstep_ring: " << e.what() << "\n";
    return kExitFailed;
  }
  if (!out.flush()) {
    err << "flashstep_ring: writing the output failed; it is missing or incomplete\n";
    return kExitFailed;
  }
  return code;
}

}  // namespace flashstep::ring

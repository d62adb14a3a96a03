// flashstep's argument handling, error lines and exit codes.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <streambuf>

#include "cli.h"
#include "common/device.h"
#include "common/error.h"
#include "common/npy.h"
#include "common/stage.h"
#include "report.h"

using flashstep::Error;
using flashstep::cli::parse_args;

namespace {
struct Result {
  int code;
  std::string out, err;
};

Result run_cli(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = flashstep::cli::run(args, out, err);
  return {code, out.str(), err.str()};
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// A fresh, empty folder under the temp directory.
std::filesystem::path empty_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("flashstep_test_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Q, K, V of shape [2, 3, N, 4] (Nq = 5, Nk = 7) in `dir`.
void write_inputs(const std::filesystem::path& dir) {
  const std::vector<float> q(2 * 3 * 5 * 4, 0.5f), kv(2 * 3 * 7 * 4, 0.25f);
  flashstep::write_npy((dir / "Q.npy").string(), {2, 3, 5, 4}, q.data());
  flashstep::write_npy((dir / "K.npy").string(), {2, 3, 7, 4}, kv.data());
  flashstep::write_npy((dir / "V.npy").string(), {2, 3, 7, 4}, kv.data());
}

// A stream buffer that takes nothing, as a full disk or a closed stdout.
struct FullBuffer : std::streambuf {
  int overflow(int) override { return traits_type::eof(); }
};
}  // namespace

TEST_CASE("cli: defaults are the embedded problem B=1 H=8 N=1024 d=64") {
  const auto o = parse_args({});
  CHECK(o.mode == flashstep::cli::Mode::kRun);
  CHECK(o.problem.B == 1);
  CHECK(o.problem.H == 8);
  CHECK(o.problem.Nq == 1024);
  CHECK(o.problem.Nk == 1024);
  CHECK(o.problem.d == 64);
  CHECK_FALSE(o.problem.causal);
  CHECK(o.stages == std::vector<std::string>{"all"});
}

TEST_CASE("cli: flags set the problem, in both --flag value and --flag=value forms") {
  const auto o = parse_args({"model", "--B", "2", "--H=3", "--N", "100", "--Nk=50", "--d", "40",
                             "--causal", "--scale", "0.5", "--stage", "01,2", "--format", "csv",
                             "--iters", "7", "--warmup", "0", "--seed", "9"});
  CHECK(o.mode == flashstep::cli::Mode::kModel);
  CHECK(o.problem.B == 2);
  CHECK(o.problem.H == 3);
  CHECK(o.problem.Nq == 100);
  CHECK(o.problem.Nk == 50);
  CHECK(o.problem.d == 40);
  CHECK(o.problem.causal);
  CHECK(*o.problem.scale == 0.5);
  CHECK(o.format == flashstep::cli::Format::kCsv);
  CHECK(o.iterations == 7);
  CHECK(o.warmup == 0);
  CHECK(o.seed == 9);
  CHECK(o.stages == std::vector<std::string>{"01", "2"});
}

TEST_CASE("cli: bad arguments throw one clear message") {
  CHECK_THROWS_WITH_AS(parse_args({"--bogus"}), "unknown argument '--bogus'", Error);
  CHECK_THROWS_WITH_AS(parse_args({"--N"}), "--N expects a value", Error);
  CHECK_THROWS_WITH_AS(parse_args({"--N", "12x"}), "--N expects an integer, got '12x'", Error);
  CHECK_THROWS_WITH_AS(parse_args({"--N", "0"}), "Nq must be >= 1, got 0", Error);
  CHECK_THROWS_WITH_AS(parse_args({"--B", "-1"}), "B must be >= 1, got -1", Error);
  CHECK_THROWS_WITH_AS(parse_args({"--d", "257"}), "d must be <= 256, got 257", Error);
  CHECK_THROWS_WITH_AS(parse_args({"--format", "xml"}), doctest::Contains("table, csv or json"), Error);
  CHECK_THROWS_WITH_AS(parse_args({"--stage", "99"}), doctest::Contains("unknown stage '99'"), Error);
  CHECK_THROWS_WITH_AS(parse_args({"--iters", "-1"}), doctest::Contains("--iters must be in"), Error);
  CHECK_THROWS_WITH_AS(parse_args({"--causal=yes"}), "--causal takes no value", Error);
  CHECK_THROWS_WITH_AS(parse_args({"--scale", "1e39"}),
                       doctest::Contains("scale must be finite in fp32"), Error);
}

TEST_CASE("cli: the command line as CLI11 reads it, in flashstep's words") {
  using flashstep::cli::Mode;
  // The mode may come after options; a later flag overrides an earlier one.
  CHECK(parse_args({"--N", "64", "model"}).mode == Mode::kModel);
  CHECK(parse_args({"--N", "100", "--Nk", "50"}).problem.Nk == 50);
  CHECK(parse_args({"--Nk", "50", "--N", "100"}).problem.Nk == 100);
  CHECK(parse_args({"--stage", "01", "--stage", "3,4"}).stages ==
        std::vector<std::string>{"3", "4"});
  CHECK_THROWS_WITH_AS(parse_args({"model", "info"}), "unknown argument 'info'", Error);
  CHECK_THROWS_WITH_AS(parse_args({"--stage", "01", "02"}), "unknown argument '02'", Error);
  CHECK_THROWS_WITH_AS(parse_args({"--bogus=3"}), "unknown argument '--bogus=3'", Error);
  CHECK_THROWS_WITH_AS(parse_args({"--N="}), "--N expects a value", Error);
  // Numbers are decimal: no octal, no hex, no silent clamping.
  CHECK(parse_args({"--N", "010"}).problem.Nq == 10);
  CHECK_THROWS_WITH_AS(parse_args({"--N", "0x10"}), "--N expects an integer, got '0x10'", Error);
  CHECK_THROWS_WITH_AS(parse_args({"--seed", "99999999999999999999"}),
                       "--seed expects an integer, got '99999999999999999999'", Error);
  CHECK_THROWS_WITH_AS(parse_args({"--scale", "1e999"}), "--scale expects a number, got '1e999'",
                       Error);
  // A flag takes no value: --causal=false must not turn the mask on.
  CHECK_THROWS_WITH_AS(parse_args({"--causal=false"}), "--causal takes no value", Error);
  CHECK(parse_args({"--causal=true"}).problem.causal);  // CLI11's reading of the bare flag
  // --help wins over everything the parse finds after it, unknown flags too.
  CHECK(parse_args({"--help", "--bogus"}).mode == Mode::kHelp);
  CHECK(parse_args({"--bogus", "model", "-h"}).mode == Mode::kHelp);
  // The usage CLI11 builds lists every option.
  const std::string usage = flashstep::cli::usage();
  for (const char* option : {"--B N", "--Nk N", "--causal", "--dtype T", "--load DIR",
                             "--stage S[,S...]", "--format F", "--overwrite", "-h,--help"}) {
    CAPTURE(option);
    CHECK(usage.find(option) != std::string::npos);
  }
}

TEST_CASE("cli: JSON output is valid JSON: non-finite numbers are null, strings escaped") {
  using namespace flashstep::cli;
  Report r;
  r.columns = {"name", "count", "value", "nan", "inf", ".hidden"};
  r.rows.push_back({text("a \"quoted\" \\ name\n\x01"), integer((1ll << 53) + 1), number(0.123456, 3),
                    number(std::nan("")), number(std::numeric_limits<double>::infinity()),
                    bytes(268435456)});
  r.rows.push_back({text("\xff not UTF-8"), integer(-1), number(-2.5), number(1.0),
                    number(-std::numeric_limits<double>::infinity()), flops(0)});
  std::ostringstream out;
  print(r, Format::kJson, out);
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(out.str());  // throws if invalid
  REQUIRE(j.size() == 2);
  CHECK(j[0].size() == 6);
  CHECK(j[0].begin().key() == "name");  // columns keep their order
  CHECK(j[0]["name"] == "a \"quoted\" \\ name\n\x01");
  CHECK(j[0]["count"] == (1ll << 53) + 1);
  CHECK(j[0]["value"] == 0.123);  // the digits the table and CSV show
  CHECK(j[0]["nan"].is_null());
  CHECK(j[0]["inf"].is_null());
  CHECK(j[0]["hidden"] == 268435456);
  CHECK(j[1]["name"] == "\xef\xbf\xbd not UTF-8");  // U+FFFD
  CHECK(j[1]["inf"].is_null());
  // CSV and the text table keep writing "inf".
  std::ostringstream csv;
  print(r, Format::kCsv, csv);
  CHECK(csv.str().find(",inf,") != std::string::npos);

  // And the command's own: one object per stage, in column order.
  const Result model = run_cli({"model", "--format", "json"});
  REQUIRE(model.code == 0);
  const nlohmann::ordered_json stages = nlohmann::ordered_json::parse(model.out);
  CHECK(stages.size() == flashstep::all_stages().size());
  CHECK(stages[0].begin().key() == "stage");
  CHECK(stages[0]["barriers"].is_null());  // not modelled: NaN
}

TEST_CASE("cli: model refuses a problem its int64 counts would overflow, rather than print negatives") {
  const auto r = run_cli({"model", "--N", "759250124", "--d", "256"});
  CHECK(r.code == 2);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("problem too large: B*H*Nq*max(Nk,64)*max(d,64)") != std::string::npos);
  CHECK(r.out.empty());
}

TEST_CASE("cli: a usage error prints exactly one line and exits 2") {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--d", "300"}, {"--frobnicate"}, {"--N", "-5"}, {"--load", "/nonexistent/dir"},
           {"--load", ""}, {"--save", ""}, {"model", "--save", "/tmp/x"}, {"--overwrite"}}) {
    CAPTURE(args);
    const auto r = run_cli(args);
    CHECK(r.code == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.rfind("flashstep: ", 0) == 0);
    CHECK(r.out.empty());
  }
}

TEST_CASE("cli: --help prints usage and exits 0, whatever else is on the line") {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--help"}, {"-h", "--d", "300"}, {"model", "--save", "/tmp/x", "--help"}}) {
    CAPTURE(args);
    const auto r = run_cli(args);
    CHECK(r.code == 0);
    CHECK(r.out.find("usage: flashstep") != std::string::npos);
    CHECK(r.err.empty());
  }
}

TEST_CASE("cli: model mode lists every registered stage, as table, CSV and JSON") {
  const auto& stages = flashstep::all_stages();
  const auto table = run_cli({"model", "--N", "4096"});
  CHECK(table.code == 0);
  for (const auto& s : stages) CHECK(table.out.find(std::string(s.name)) != std::string::npos);

  const auto csv = run_cli({"model", "--N", "4096", "--format", "csv"});
  CHECK(csv.code == 0);
  CHECK(count_lines(csv.out) == static_cast<int>(stages.size()) + 1);
  CHECK(csv.out.rfind("stage,dtype,HBM read,HBM write,", 0) == 0);
  CHECK(csv.out.find("02_safe_softmax,fp32,") != std::string::npos);  // each stage's own type

  const auto json = run_cli({"model", "--format", "json", "--stage", "02"});
  CHECK(json.code == 0);
  CHECK(json.out.find("\"stage\": \"02_safe_softmax\"") != std::string::npos);
  CHECK(json.out.find("\"HBM read\": ") != std::string::npos);
}

TEST_CASE("cli: CSV and JSON rows say H_kv, right after H, also when --H-kv is not given") {
  const auto plain = run_cli({"model", "--stage", "09_split_kv", "--B", "2", "--H", "8", "--Nq",
                              "1", "--Nk", "300", "--d", "64", "--format", "csv"});
  REQUIRE(plain.code == 0);
  CHECK(plain.out.find(",device memory,B,H,H_kv,Nq,Nk,d,causal\n") != std::string::npos);
  CHECK(plain.out.find(",2,8,8,1,300,64,0\n") != std::string::npos);  // H_kv = H

  const auto grouped = run_cli({"model", "--stage", "09_split_kv", "--B", "2", "--H", "8",
                                "--H-kv", "2", "--Nq", "1", "--Nk", "300", "--d", "64",
                                "--format", "json"});
  REQUIRE(grouped.code == 0);
  const nlohmann::ordered_json rows = nlohmann::ordered_json::parse(grouped.out);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0]["H"] == 8);
  CHECK(rows[0]["H_kv"] == 2);
  auto h = rows[0].find("H");
  CHECK(std::next(h).key() == "H_kv");
}

TEST_CASE("cli: without a GPU, run prints the model and says so, and with one it runs and checks") {
  std::string why;
  if (!flashstep::cuda_device_available(&why)) {
    const auto r = run_cli({"--N", "64"});
    CHECK(r.code == 0);
    CHECK(r.err.find("no usable CUDA device") != std::string::npos);
    CHECK(r.out.find("HBM read") != std::string::npos);
    CHECK(r.out.find("median ms") == std::string::npos);  // no invented timings
  } else {
    const auto r = run_cli({"--N", "64", "--iters", "2", "--format", "csv"});
    CHECK(r.code == 0);
    CHECK(r.out.find(",ok,") != std::string::npos);
  }
}

TEST_CASE("cli: --load takes the problem from the .npy shapes and rejects mismatches") {
  const auto dir = empty_dir("load");
  write_inputs(dir);
  const std::vector<float> kv(2 * 3 * 7 * 4, 0.25f);
  const auto ok = run_cli({"model", "--load", dir.string(), "--format", "csv", "--stage", "01"});
  CHECK(ok.code == 0);
  CHECK(ok.out.find(",2,3,3,5,7,4,0") != std::string::npos);  // B, H, H_kv, Nq, Nk, d, causal

  const auto contradict = run_cli({"model", "--load", dir.string(), "--d", "8"});
  CHECK(contradict.code == 2);
  CHECK(contradict.err.find("--d 8 contradicts") != std::string::npos);
  // --N sets Nq and Nk: it must agree with both files, not be dropped.
  const auto contradict_n = run_cli({"model", "--load", dir.string(), "--N", "999"});
  CHECK(contradict_n.code == 2);
  CHECK(contradict_n.err.find("--N 999 contradicts the loaded files' 5") != std::string::npos);
  CHECK(run_cli({"model", "--load", dir.string(), "--N", "5"}).code == 2);  // Nk is 7

  flashstep::write_npy((dir / "V.npy").string(), {2, 3, 6, 4}, kv.data());
  const auto mismatch = run_cli({"model", "--load", dir.string()});
  CHECK(mismatch.code == 2);
  CHECK(mismatch.err.find("K.npy and V.npy shapes differ") != std::string::npos);
}

TEST_CASE("cli: inputs whose reference is NaN everywhere are reported unchecked, never ok") {
  const auto dir = empty_dir("nan");
  const std::vector<float> nan(1 * 2 * 8 * 4, std::nanf(""));
  for (const char* name : {"Q.npy", "K.npy", "V.npy", "dO.npy"}) {
    flashstep::write_npy((dir / name).string(), {1, 2, 8, 4}, nan.data());
  }
  const auto r = run_cli({"--load", dir.string(), "--backward", "--iters", "0", "--format", "csv"});
  CHECK(r.code == 0);
  if (flashstep::cuda_device_available()) {
    CHECK(r.out.find(",ok,") == std::string::npos);
    CHECK(r.out.find("02_safe_softmax,fp32,unchecked,") != std::string::npos);
    CHECK(r.err.find("02_safe_softmax: nothing to compare") != std::string::npos);
    CHECK(r.err.find("02_safe_softmax backward: dQ: nothing to compare") != std::string::npos);
  } else {
    CHECK(r.err.find("no usable CUDA device") != std::string::npos);
    CHECK(r.out.find("02_safe_softmax,") != std::string::npos);
  }
}

TEST_CASE("cli: --save refuses, before any work, a path it cannot fill or files it would replace") {
  const auto dir = empty_dir("save");
  const std::string target = (dir / "out").string();
  SUBCASE("files already there: refused unless --overwrite") {
    std::filesystem::create_directories(target);
    std::ofstream(target + "/O_01_naive.npy") << "the user's";
    const auto r = run_cli({"--save", target, "--stage", "01", "--N", "16"});
    CHECK(r.code == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find("O_01_naive.npy exists; pass --overwrite") != std::string::npos);
    // Files another stage would write are not in the way.
    CHECK(run_cli({"--save", target, "--stage", "02", "--N", "16"}).err.find("exists") ==
          std::string::npos);
    const auto over = run_cli({"--save", target, "--stage", "01", "--N", "16", "--overwrite"});
    CHECK(over.err.find("exists") == std::string::npos);
  }
  SUBCASE("the path is a file, or runs through one") {
    std::ofstream(target) << "a file";
    for (const std::string& path : {target, target + "/sub"}) {
      const auto r = run_cli({"--save", path, "--N", "16"});
      CHECK(r.code == 2);
      CHECK(count_lines(r.err) == 1);
      CHECK(r.err.find("is not a folder") != std::string::npos);
    }
  }
  SUBCASE("something there that is not a regular file is never replaced") {
    std::filesystem::create_directories(target + "/Q.npy");
    const auto r = run_cli({"--save", target, "--N", "16", "--overwrite"});
    CHECK(r.code == 2);
    CHECK(r.err.find("Q.npy exists and is not a regular file") != std::string::npos);
  }
  SUBCASE("without a GPU nothing can be saved: it says so and fails") {
    if (!flashstep::cuda_device_available()) {
      const auto r = run_cli({"--save", target, "--N", "16"});
      CHECK(r.code == 1);
      CHECK(count_lines(r.err) == 1);
      CHECK(r.err.find("--save needs a run, nothing saved") != std::string::npos);
      CHECK(r.out.empty());
      CHECK_FALSE(std::filesystem::exists(target));
    } else {
      const auto r = run_cli({"--save", target, "--N", "16", "--stage", "01", "--iters", "0"});
      CHECK(r.code == 0);
      CHECK(std::filesystem::is_regular_file(target + "/O_01_naive.npy"));
    }
  }
}

TEST_CASE("cli: output that cannot be written is a failure with one line, not exit 0") {
  FullBuffer full;
  std::ostream out(&full);
  std::ostringstream err;
  CHECK(flashstep::cli::run({"model"}, out, err) == 1);
  CHECK(err.str() == "flashstep: writing the output failed; it is missing or incomplete\n");
}

TEST_CASE("cli: anything but an Error escaping still ends in one line and exit 1") {
  // A stream that throws on failure: std::ios_base::failure, no flashstep::Error.
  FullBuffer full;
  std::ostream out(&full);
  out.exceptions(std::ios::badbit);
  std::ostringstream err;
  int code = 0;
  CHECK_NOTHROW(code = flashstep::cli::run({"model"}, out, err));
  CHECK(code == 1);
  CHECK(count_lines(err.str()) == 1);
}

TEST_CASE("cli: a problem too large for the device is refused before the host allocates it") {
  // 2^31 - 1 heads of 16 x 16 x 256: within the contract, 2^45 bytes of Q alone.
  const std::vector<std::string> args = {"--B", "2147483647", "--N", "16", "--d", "256",
                                         "--H", "1", "--stage", "05", "--iters", "0"};
  const auto r = run_cli(args);
  if (flashstep::cuda_device_available()) {
    CHECK(r.code == 1);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find("of device memory in every selected stage") != std::string::npos);
  } else {
    CHECK(r.code == 0);
    CHECK(r.err.find("no usable CUDA device") != std::string::npos);
    CHECK(r.out.find("05_sequence_parallel") != std::string::npos);
  }
}

TEST_CASE("cli: --backward selects the stages with a backward, and says which have one") {
  CHECK(parse_args({"--backward"}).backward);
  CHECK_THROWS_WITH_AS(parse_args({"--backward", "--stage", "01,03"}),
                       doctest::Contains("02_safe_softmax, 05_sequence_parallel"), Error);
  CHECK_THROWS_WITH_AS(parse_args({"--backward=1"}), doctest::Contains("takes no value"), Error);
  const Result r = run_cli({"--backward", "--stage", "04"});
  CHECK(r.code == 2);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("--backward: no selected stage has a backward pass") != std::string::npos);
}

TEST_CASE("cli: model --backward prints the backwards' model with their device memory") {
  const Result r = run_cli({"model", "--backward", "--N", "16384", "--H", "32", "--d", "64",
                            "--format", "csv"});
  REQUIRE(r.code == 0);
  CHECK(r.out.rfind("stage,dtype,HBM read,HBM write,", 0) == 0);
  CHECK(r.out.find("device memory") != std::string::npos);
  CHECK(r.out.find("02_safe_softmax,") != std::string::npos);
  CHECK(r.out.find("05_sequence_parallel,") != std::string::npos);
  CHECK(r.out.find("07_tensor_core,bf16,") != std::string::npos);  // in its native type
  CHECK(r.out.find("07_tensor_core_deterministic,bf16,") != std::string::npos);
  CHECK(r.out.find("01_naive") == std::string::npos);  // no backward: not listed
  CHECK(count_lines(r.out) == 5);
  // The standard backward holds P and dS: 2 * 32 * 16384^2 floats, and more.
  const auto& s02 = *flashstep::select_stages("02").front();
  const auto& s05 = *flashstep::select_stages("05").front();
  flashstep::Problem p;
  p.H = 32;
  p.Nq = p.Nk = 16384;
  CHECK(flashstep::device_bytes_needed(s02, p, true) > 2 * 32 * p.Nq * p.Nk * 4);
  CHECK(flashstep::device_bytes_needed(s05, p, true) < (2ll << 30));
}

TEST_CASE("cli: --dtype picks the element type, stages without it are skipped with one note") {
  const auto o = parse_args({"--dtype", "bf16"});
  REQUIRE(o.dtype);
  CHECK(*o.dtype == flashstep::DType::kBf16);
  CHECK(o.problem.dtype == flashstep::DType::kBf16);
  CHECK_FALSE(parse_args({}).dtype);  // unset: each stage in its own type
  CHECK_THROWS_WITH_AS(parse_args({"--dtype", "fp64"}),
                       "--dtype must be fp32, fp16 or bf16, got 'fp64'", Error);

  // Stages 02, 03, 07_tensor_core (and its deterministic-backward entry),
  // 08_hopper and both entries of 09 run in fp16 (07's and 08's ablation
  // steps in bf16 only); the rest are named once on stderr.
  const Result r = run_cli({"model", "--dtype", "fp16", "--N", "256", "--format", "csv"});
  REQUIRE(r.code == 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("--dtype fp16: skipping 01_naive, 04_fa2_q_outer") != std::string::npos);
  CHECK(r.err.find("07_step1_plain_mma") != std::string::npos);
  CHECK(count_lines(r.out) == 8);
  CHECK(r.out.find("08_hopper,fp16,") != std::string::npos);
  CHECK(r.out.find("02_safe_softmax,fp16,") != std::string::npos);
  CHECK(r.out.find("03_fa1_kv_outer,fp16,") != std::string::npos);
  CHECK(r.out.find("07_tensor_core,fp16,") != std::string::npos);
  CHECK(r.out.find("09_split_kv,fp16,") != std::string::npos);
  CHECK(r.out.find("09_one_block,fp16,") != std::string::npos);

  // No selected stage runs in the type: one line naming those that do, exit 2.
  const Result none = run_cli({"model", "--dtype", "bf16", "--stage", "04,05"});
  CHECK(none.code == 2);
  CHECK(count_lines(none.err) == 1);
  CHECK(none.err.find("--dtype bf16: no selected stage runs in bf16 (these do: "
                      "02_safe_softmax, 03_fa1_kv_outer, 07_step1_plain_mma") != std::string::npos);
  CHECK(none.out.empty());

  // Stages 02 and 05's backwards run in fp32 only: --backward in 16 bits on
  // them alone is a clear error naming the backwards that do.
  const Result bwd = run_cli({"--backward", "--dtype", "bf16", "--stage", "02,05"});
  CHECK(bwd.code == 2);
  CHECK(count_lines(bwd.err) == 1);
  CHECK(bwd.err.find("no selected stage has a backward in bf16 (these have one: "
                     "02_safe_softmax (fp32), 05_sequence_parallel (fp32), 07_tensor_core "
                     "(bf16, fp16)") != std::string::npos);
}

TEST_CASE("cli: model counts 2-byte elements in fp16 and bf16") {
  auto hbm_read = [](const std::string& dtype) {
    const Result r = run_cli({"model", "--dtype", dtype, "--stage", "02", "--format", "json"});
    REQUIRE(r.code == 0);
    const std::string key = "\"HBM read\": ";
    const size_t at = r.out.find(key);
    REQUIRE(at != std::string::npos);
    CHECK(r.out.find("\"dtype\": \"" + dtype + "\"") != std::string::npos);
    return std::stoll(r.out.substr(at + key.size()));
  };
  const long long fp32 = hbm_read("fp32"), bf16 = hbm_read("bf16");
  // Q, K, V and P (read by kernel 3) halve; S (read three times) stays fp32.
  CHECK(bf16 < fp32);
  CHECK(bf16 > fp32 / 2);
}

TEST_CASE("cli: --load reads float16 (<f2) arrays as well as float32, widened exactly") {
  const auto dir = std::filesystem::temp_directory_path() / "flashstep_test_load_f2";
  std::filesystem::create_directories(dir);
  // A minimal version 1.0 .npy of float16 ones.
  auto write_f2 = [&](const std::string& name, const std::string& shape, std::size_t n) {
    std::string header = "{'descr': '<f2', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::ofstream f(dir / name, std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    const char len[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
    f.write(len, 2);
    f << header;
    const char one[2] = {0x00, 0x3C};  // fp16 1.0, little-endian
    for (std::size_t k = 0; k < n; ++k) f.write(one, 2);
  };
  write_f2("Q.npy", "(1, 2, 3, 8)", 48);
  write_f2("K.npy", "(1, 2, 5, 8)", 80);
  write_f2("V.npy", "(1, 2, 5, 8)", 80);
  const auto q = flashstep::read_npy((dir / "Q.npy").string());
  CHECK(q.shape == std::vector<std::int64_t>{1, 2, 3, 8});
  CHECK(q.data == std::vector<float>(48, 1.0f));
  const Result r = run_cli({"model", "--load", dir.string(), "--dtype", "fp16", "--format", "csv",
                            "--stage", "02"});
  CHECK(r.code == 0);
  CHECK(r.out.find("02_safe_softmax,fp16,") != std::string::npos);
  CHECK(r.out.find(",1,2,2,3,5,8,0") != std::string::npos);  // B, H, H_kv, Nq, Nk, d, causal
}

TEST_CASE("cli: info prints the device's facts, or one line and exit 1 without a GPU") {
  const Result r = run_cli({"info", "--format", "csv"});
  if (flashstep::cuda_device_available()) {
    CHECK(r.code == 0);
    CHECK(r.out.rfind("gpu,sm_count,max_sm_clock_mhz,", 0) == 0);
  } else {
    CHECK(r.code == 1);
    CHECK(r.out.empty());
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find("no usable CUDA device") != std::string::npos);
  }
}

TEST_CASE("cli: 16-bit gradients are checked against a naive backward reading the stage's O") {
  // Stage 07's backward in fp16, where a naive reading its own O failed
  // correct backwards at tiny d (common/check.h, BackwardTruth), over a few
  // seeds; then a problem above the all-heads budget, where the naive reads
  // head 0's rows of the stage's O (rows of another head would fail
  // backward_truth's forward check: an error, exit 1).
  const auto run16 = [](std::vector<std::string> args) {
    for (const char* a : {"--backward", "--dtype", "fp16", "--iters", "0", "--format", "csv"}) {
      args.emplace_back(a);
    }
    return run_cli(args);
  };
  if (!flashstep::cuda_device_available()) {
    const Result r = run16({"--stage", "07_tensor_core", "--d", "1"});
    CHECK(r.err.find("no usable CUDA device") != std::string::npos);
    return;
  }
  for (int seed = 0; seed < 8; ++seed) {
    CAPTURE(seed);
    const Result r = run16({"--stage", "07_tensor_core,07_tensor_core_deterministic", "--B", "2",
                            "--H", "3", "--Nq", "77", "--Nk", "45", "--d", "1", "--causal",
                            "--seed", std::to_string(seed)});
    CAPTURE(r.err);
    CHECK(r.code == 0);
    CHECK(r.err.find("reading the stage's O") != std::string::npos);
    CHECK(r.err.find("its own O") == std::string::npos);
  }
  // 16 heads of 2048 x 2048 x 64: 4.3e9 multiply-adds, over the CLI's
  // all-heads budget of 4e9; head 0 alone is checked.
  const Result r = run16({"--stage", "07_tensor_core", "--H", "16", "--N", "2048", "--d", "64"});
  CAPTURE(r.err);
  CHECK(r.code == 0);
  CHECK(r.err.find("reading the stage's O, of head 0 only") != std::string::npos);
  // Grouped, 8 query heads per K/V head: K/V head 0's dK and dV sum over 8
  // query heads, so head 0's whole group is checked (a wrong head map in the
  // stage's backward would fail it: exit 1).
  const Result g = run16({"--stage", "07_tensor_core", "--H", "16", "--H-kv", "2", "--N", "2048",
                          "--d", "64"});
  CAPTURE(g.err);
  CHECK(g.code == 0);
  CHECK(g.err.find("reading the stage's O, of head 0's group only") != std::string::npos);
}

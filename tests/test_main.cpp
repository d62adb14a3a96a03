// doctest's main for the CPU tests, failing a run whose filters match no test case.
//
// CTest runs each test case as its own entry (doctest_discover_tests passes
// --test-case=NAME). A filter that matches nothing runs zero test cases, and
// doctest exits 0 for that, so CTest would show Passed for a test that ran
// nothing: a name holding a ';' does exactly that, since CMake splits the name
// there into two entries that match no test case. So such a run fails here.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

namespace {

bool g_ran_nothing = false;

// Notes whether the run's filters matched any test case; reports nothing else.
struct RanNothingListener : doctest::IReporter {
  explicit RanNothingListener(const doctest::ContextOptions&) {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    g_ran_nothing = stats.numTestCasesPassingFilters == 0;
  }
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("ran_nothing", 1, RanNothingListener);

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int status = context.run();
  if (g_ran_nothing) {
    std::fprintf(stderr, "test_cpu: no test case matches the filters: the run tested nothing\n");
    return EXIT_FAILURE;
  }
  return status;
}

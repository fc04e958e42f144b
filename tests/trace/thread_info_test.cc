// Thread names and namespace tids in the trace (docs/rvtrace.md, "Thread line" and "Thread info line"): the writer
// puts what it knows on the thread line and writes a thread_info line when a part changes; the reader ends with the
// latest of each, and reads traces without them (the in-process recorder's, older rvbpfd's).
#include <gtest/gtest.h>

#include <string>

#include "common/label_bound.h"
#include "trace/inspect.h"
#include "trace/reader.h"
#include "trace/writer.h"
#include "trace_test_util.h"

namespace rvbpfd {
namespace {

using ::rvbpfd::testing::Ev;
using ::rvbpfd::testing::ReadAll;
using ::rvbpfd::testing::ScratchDir;

ThreadInfo Info(std::optional<std::string> name, std::optional<std::string> native, std::optional<uint32_t> ns) {
  ThreadInfo i;
  i.name = std::move(name);
  i.native_name = std::move(native);
  i.ns_tid = ns;
  return i;
}

const std::string kHeader =
    "{\"rvtrace\":1,\"recorder\":\"in-process\",\"recorder_version\":\"1\",\"pid\":10,\"ruby_version\":\"3.4.5\","
    "\"clock\":\"monotonic\",\"origin_ns\":0,\"started_at\":\"x\",\"channels\":[],\"main_thread\":1}\n";

TEST(ThreadInfoTrace, NamesOnTheThreadLineAndRenamesAsThreadInfoLinesRoundTrip) {
  ScratchDir dir;
  const std::string path = dir.File("t.rvtrace");
  TraceHeader header;
  header.pid = 10;
  header.ruby_version = "3.4.5";
  Result<TraceWriter> w = TraceWriter::Create(path, header);
  ASSERT_TRUE(w.ok()) << w.error().ToString();
  w->SetThreadInfo(1, Info(std::nullopt, "ruby", std::nullopt), 1000);
  ASSERT_TRUE(w->Write(Ev(1000, EventName::kGvlAcquired, 1, 10)).ok());
  // Known before the thread's first event: on its thread line.
  w->SetThreadInfo(2, Info("worker-1", "worker-1", 7), 2000);
  ASSERT_TRUE(w->Write(Ev(2000, EventName::kGvlAcquired, 2, 11)).ok());
  // Unchanged: no line. Renamed: a thread_info line with the changed parts only.
  w->SetThreadInfo(2, Info("worker-1", "worker-1", 7), 3000);
  w->SetThreadInfo(2, Info("worker-renamed", std::nullopt, std::nullopt), 4000);
  ASSERT_TRUE(w->Write(Ev(4000, EventName::kGvlReleased, 2, 11)).ok());
  ASSERT_TRUE(w->Finish(FinishInfo{5000}).ok());

  const std::string text = ReadAll(path);
  EXPECT_NE(text.find("{\"thread\":{\"ruby_thread\":2,\"main\":false,\"name\":\"worker-1\",\"native_name\":\"worker-1\","
                      "\"ns_tid\":7}}\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("{\"thread_info\":{\"ruby_thread\":2,\"t_ns\":4000,\"name\":\"worker-renamed\"}}\n"),
            std::string::npos)
      << text;
  size_t info_lines = 0;
  for (size_t at = text.find("thread_info"); at != std::string::npos; at = text.find("thread_info", at + 1)) {
    ++info_lines;
  }
  EXPECT_EQ(info_lines, 1u) << text;

  Result<TraceFile> trace = TraceReader::ReadFile(path);
  ASSERT_TRUE(trace.ok()) << trace.error().ToString();
  const ThreadInfo* t2 = trace->FindThreadInfo(2);
  ASSERT_NE(t2, nullptr);
  EXPECT_EQ(*t2, Info("worker-renamed", "worker-1", 7));
  EXPECT_EQ(trace->ThreadName(2), "worker-renamed");
  EXPECT_EQ(RubyThreadLabel(*trace, 2), "Thread #2 (worker-renamed)");
  // The main thread's native name is the process's, which unnamed threads inherit: not a name of its own.
  EXPECT_EQ(trace->ThreadName(1), "");
  EXPECT_EQ(RubyThreadLabel(*trace, 1), "main");
}

TEST(ThreadInfoTrace, ANativeNameInheritedFromTheProcessIsNoName) {
  const std::string text = kHeader +
                           "{\"thread\":{\"ruby_thread\":1,\"main\":true,\"native_name\":\"ruby\"}}\n"
                           "{\"thread\":{\"ruby_thread\":2,\"main\":false,\"native_name\":\"ruby\"}}\n"
                           "{\"thread\":{\"ruby_thread\":3,\"main\":false,\"native_name\":\"app.rb:12\"}}\n";
  Result<TraceFile> trace = TraceReader::Parse(text, "t");
  ASSERT_TRUE(trace.ok()) << trace.error().ToString();
  EXPECT_EQ(RubyThreadLabel(*trace, 2), "Thread #2");
  EXPECT_EQ(RubyThreadLabel(*trace, 3), "Thread #3 (app.rb:12)");
}

TEST(ThreadInfoTrace, TracesWithoutNamesReadAsBefore) {
  const std::string text = kHeader + "{\"thread\":{\"ruby_thread\":2,\"main\":false,\"vm_serial\":5}}\n";
  Result<TraceFile> trace = TraceReader::Parse(text, "t");
  ASSERT_TRUE(trace.ok()) << trace.error().ToString();
  ASSERT_EQ(trace->threads.size(), 1u);
  EXPECT_TRUE(trace->threads[0].info.empty());
  EXPECT_EQ(RubyThreadLabel(*trace, 2), "Thread #2");
}

TEST(ThreadInfoTrace, HostileValuesAreIgnoredOrBounded) {
  const std::string long_name(5000, 'x');
  const std::string text = kHeader +
                           // A thread_info before any thread line of its thread: ignored.
                           "{\"thread_info\":{\"ruby_thread\":2,\"t_ns\":1,\"name\":\"early\"}}\n"
                           "{\"thread\":{\"ruby_thread\":2,\"main\":false,\"name\":17,\"native_name\":[\"a\"],"
                           "\"ns_tid\":-4}}\n"
                           "{\"thread_info\":{\"ruby_thread\":2,\"t_ns\":2,\"name\":\"" +
                           long_name + "\",\"ns_tid\":\"9\"}}\n";
  Result<TraceFile> trace = TraceReader::Parse(text, "t");
  ASSERT_TRUE(trace.ok()) << trace.error().ToString();
  const ThreadInfo* t2 = trace->FindThreadInfo(2);
  ASSERT_NE(t2, nullptr);
  ASSERT_TRUE(t2->name.has_value());
  EXPECT_LE(t2->name->size(), kMaxLabelBytes);
  EXPECT_TRUE(t2->name->ends_with(kTruncatedMark));
  EXPECT_FALSE(t2->native_name.has_value());
  EXPECT_FALSE(t2->ns_tid.has_value());
  // A thread_info line that is not an object is a corrupt line.
  EXPECT_FALSE(TraceReader::Parse(kHeader + "{\"thread_info\":3}\n", "t").ok());
}

}  // namespace
}  // namespace rvbpfd

// Reading multi-process traces (docs/rvtrace.md, "Process lines") and splitting them into one trace per process.
#include "trace/processes.h"

#include <gtest/gtest.h>

#include <string>

#include "trace/multi_process_trace.h"
#include "trace/reader.h"

namespace rvbpfd {
namespace {

using ::rvbpfd::testing::kMultiProcessTrace;

constexpr std::string_view kHeader =
    R"({"rvtrace":1,"recorder":"rvbpfd","pid":10,"ruby_version":"3.3.8","command":["ruby","a.rb"]})"
    "\n";

TraceFile ParseOk(std::string_view text) {
  Result<TraceFile> file = TraceReader::Parse(text, "t");
  EXPECT_TRUE(file.ok()) << (file.ok() ? "" : file.error().ToString());
  return file.ok() ? std::move(file).value() : TraceFile{};
}

std::string ParseError(const std::string& body) {
  Result<TraceFile> file = TraceReader::Parse(std::string(kHeader) + body, "t");
  return file.ok() ? "" : file.error().message();
}

TEST(ProcessLines, ReadEveryKey) {
  const TraceFile f = ParseOk(kMultiProcessTrace);
  ASSERT_EQ(f.processes.size(), 4u);
  EXPECT_TRUE(f.MultiProcess());
  const ProcessInfo* child = f.FindProcess(2);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->pid, 4243u);
  EXPECT_EQ(child->parent, 1u);
  EXPECT_EQ(child->cause, "fork");
  EXPECT_EQ(child->t_ns, 1'400'000u);
  EXPECT_EQ(child->command, (std::vector<std::string>{"ruby", "app.rb"}));
  EXPECT_EQ(child->ruby_version, "3.3.8");
  EXPECT_EQ(child->build_id, "ab12");
  EXPECT_EQ(f.FindProcess(3)->skipped, "not Ruby: /bin/sh");
  EXPECT_EQ(f.FindProcess(4)->cause, "exec");
  EXPECT_EQ(f.FindProcess(4)->parent, 2u);
  EXPECT_FALSE(f.FindProcess(1)->parent.has_value());
  ASSERT_EQ(f.process_ends.size(), 3u);
  EXPECT_EQ(f.FindProcessEnd(2)->how, "exec");
  EXPECT_FALSE(f.FindProcessEnd(2)->exit_code.has_value());
  EXPECT_EQ(f.FindProcessEnd(4)->exit_code, 3);
  EXPECT_EQ(f.FindProcessEnd(1), nullptr);
  EXPECT_EQ(f.unknown_lines, 0u);
}

TEST(ProcessLines, AnEndBySignalReadsBackAndWaitStatusesSplit) {
  const TraceFile f = ParseOk(std::string(kHeader) +
                              R"({"process":{"id":1,"pid":10}})" "\n"
                              R"({"process":{"id":2,"pid":11,"parent":1,"cause":"fork"}})" "\n"
                              R"({"process_end":{"id":2,"t_ns":5,"how":"exit","signal":9}})" "\n");
  ASSERT_NE(f.FindProcessEnd(2), nullptr);
  EXPECT_EQ(f.FindProcessEnd(2)->signal, 9);
  EXPECT_FALSE(f.FindProcessEnd(2)->exit_code.has_value());
  ProcessEnd exited, killed, dumped, stopped;
  SetExitStatus(&exited, 3 << 8);
  SetExitStatus(&killed, 15);
  SetExitStatus(&dumped, 0x80 | 11);  // SIGSEGV with a core
  SetExitStatus(&stopped, (19 << 8) | 0x7f);
  EXPECT_EQ(exited.exit_code, 3);
  EXPECT_FALSE(exited.signal.has_value());
  EXPECT_EQ(killed.signal, 15);
  EXPECT_EQ(dumped.signal, 11);
  EXPECT_FALSE(stopped.exit_code.has_value() || stopped.signal.has_value());
}

TEST(ProcessLines, ThreadsAndEventsKnowTheirProcess) {
  const TraceFile f = ParseOk(kMultiProcessTrace);
  EXPECT_EQ(f.ProcessOf(1), 1u);
  EXPECT_EQ(f.ProcessOf(2), 2u);
  EXPECT_EQ(f.ProcessOf(3), 2u);
  EXPECT_EQ(f.ProcessOf(4), 4u);
  EXPECT_EQ(f.ProcessOf(99), 1u);  // no line: the root
  for (const TraceEvent& e : f.events) {
    if (e.ruby_thread) {
      EXPECT_EQ(e.process, f.ProcessOf(*e.ruby_thread)) << e.t_ns;
    }
    // The GC naming no thread ran on tid 4243, which process 4 (the exec'd image) held last.
    if (e.event == EventName::kGcEnter) {
      EXPECT_EQ(e.process, 4u);
    }
    if (e.event == EventName::kTracingStopped) {
      EXPECT_EQ(e.process, kRootProcessId);
    }
  }
  // Each process has its own main thread.
  EXPECT_TRUE(f.IsMain(2));
  EXPECT_TRUE(f.IsMain(4));
  EXPECT_FALSE(f.IsMain(3));
}

TEST(ProcessLines, Labels) {
  const TraceFile f = ParseOk(kMultiProcessTrace);
  EXPECT_EQ(f.ProcessLabel(1), "pid 4242 (ruby app.rb)");
  EXPECT_EQ(f.ProcessLabel(3), "pid 4244 (/bin/sh -c true)");
  EXPECT_EQ(f.ProcessLabel(77), "process 77");
  ProcessInfo bare;
  bare.id = 5;
  EXPECT_EQ(ProcessLabel(bare), "process 5");
  bare.pid = 9;
  bare.command = {std::string(100, 'x')};
  const std::string label = ProcessLabel(bare);
  EXPECT_EQ(label, "pid 9 (" + std::string(kMaxProcessCommandLabelBytes, 'x') + "\xe2\x80\xa6)");
}

TEST(ProcessLines, ThreadNameInheritsItsOwnProcessMainName) {
  const TraceFile f = ParseOk(std::string(kHeader) +
                              R"({"process":{"id":1,"pid":10}}
{"process":{"id":2,"pid":11,"parent":1,"cause":"fork"}}
{"thread":{"ruby_thread":1,"main":true,"native_name":"puma"}}
{"thread":{"ruby_thread":2,"main":true,"process":2,"native_name":"sidekiq"}}
{"thread":{"ruby_thread":3,"process":2,"native_name":"sidekiq"}}
{"thread":{"ruby_thread":4,"process":2,"native_name":"puma"}}
)");
  EXPECT_EQ(f.ThreadName(3), "");       // sidekiq's comm, inherited from its own main thread
  EXPECT_EQ(f.ThreadName(4), "puma");   // not its process's name: a name of its own
}

TEST(ProcessLines, OneProcessTraceHasNone) {
  const TraceFile f = ParseOk(std::string(kHeader) + R"({"thread":{"ruby_thread":1,"main":true}}
{"t_ns":5,"ruby_thread":1,"event":"gvl_acquired"}
)");
  EXPECT_TRUE(f.processes.empty());
  EXPECT_FALSE(f.MultiProcess());
  EXPECT_EQ(f.events.at(0).process, kRootProcessId);
  EXPECT_EQ(f.ProcessLabel(1), "pid 10 (ruby a.rb)");
  // An explicit "process":1 needs no process line: the root is the header's.
  EXPECT_EQ(ParseError(R"({"thread":{"ruby_thread":1,"main":true,"process":1}})"
                       "\n"),
            "");
}

TEST(ProcessLines, RootMadeFromTheHeaderWhenItHasNoLine) {
  const TraceFile f = ParseOk(std::string(kHeader) + R"({"process":{"id":2,"pid":11,"parent":1,"cause":"fork"}}
)");
  ASSERT_EQ(f.processes.size(), 2u);
  EXPECT_EQ(f.processes[0].id, kRootProcessId);
  EXPECT_EQ(f.processes[0].pid, 10u);
  EXPECT_EQ(f.processes[0].command, (std::vector<std::string>{"ruby", "a.rb"}));
  EXPECT_EQ(f.processes[1].parent, 1u);  // the root always exists, line or not
}

TEST(ProcessLines, ParentsNeverFormACycle) {
  // A crafted file: process 2 (parent 1) before the root's line, which names 2 as its parent.
  const TraceFile f = ParseOk(std::string(kHeader) + R"({"process":{"id":2,"parent":1}}
{"process":{"id":1,"parent":2}}
{"process":{"id":3,"parent":3}}
)");
  EXPECT_EQ(f.FindProcess(2)->parent, 1u);
  EXPECT_FALSE(f.FindProcess(1)->parent.has_value());
  EXPECT_FALSE(f.FindProcess(3)->parent.has_value());
}

TEST(ProcessLines, HostileInput) {
  EXPECT_NE(ParseError(R"({"process":{"pid":3}})"
                       "\n")
                .find("process \"id\""),
            std::string::npos);
  EXPECT_NE(ParseError(R"({"process":{"id":0}})"
                       "\n"),
            "");
  EXPECT_NE(ParseError(R"({"process":{"id":"2"}})"
                       "\n"),
            "");
  EXPECT_NE(ParseError(R"({"process":7})"
                       "\n"),
            "");
  // A thread of a process the file never described is a corrupt trace, as a stack used before its line.
  EXPECT_NE(ParseError(R"({"thread":{"ruby_thread":2,"process":5}})"
                       "\n")
                .find("before its process line"),
            std::string::npos);
  EXPECT_NE(ParseError(R"({"thread":{"ruby_thread":2,"process":"x"}})"
                       "\n"),
            "");
  EXPECT_NE(ParseError(R"({"process_end":{"id":5,"how":"exit"}})"
                       "\n"),
            "");
  EXPECT_NE(ParseError(R"({"process":{"id":2,"pid":1}})"
                       "\n"
                       R"({"process":{"id":2,"pid":3}})"
                       "\n")
                .find("defined twice"),
            std::string::npos);
  // Optional keys of another type are ignored; a parent defined nowhere earlier (or itself) is dropped.
  const TraceFile f = ParseOk(std::string(kHeader) +
                              R"({"process":{"id":1,"pid":10}}
{"process":{"id":2,"pid":"x","parent":2,"cause":5,"t_ns":-1,"command":["a",3,"b"],"skipped":[]}}
{"process":{"id":3,"parent":9}}
{"process_end":{"id":2,"t_ns":"soon","how":1,"exit_code":"x"}}
{"process_end":{"id":2,"how":"exit"}}
)");
  const ProcessInfo* p = f.FindProcess(2);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->pid, 0u);
  EXPECT_FALSE(p->parent.has_value());
  EXPECT_EQ(p->cause, "");
  EXPECT_EQ(p->command, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(f.FindProcess(3)->parent.has_value());
  ASSERT_EQ(f.process_ends.size(), 1u);  // the first end is kept
  EXPECT_EQ(f.process_ends[0].how, "");
  EXPECT_FALSE(f.process_ends[0].exit_code.has_value());
}

TEST(ProcessLines, LongStringsAreBounded) {
  const std::string big(5000, 'a');
  std::string args;
  for (int i = 0; i < 100; ++i) args += (i ? ",\"" : "\"") + big + "\"";
  const TraceFile f = ParseOk(std::string(kHeader) + R"({"process":{"id":2,"skipped":")" + big +
                              R"(","command":[)" + args + "]}}\n");
  const ProcessInfo* p = f.FindProcess(2);
  ASSERT_NE(p, nullptr);
  EXPECT_LE(p->skipped.size(), 1024u);
  EXPECT_EQ(p->command.size(), 64u);
  for (const std::string& arg : p->command) EXPECT_LE(arg.size(), 1024u);
}

TEST(SplitByProcess, OnePartPerTracedProcess) {
  const TraceFile f = ParseOk(kMultiProcessTrace);
  const std::vector<ProcessTrace> parts = SplitByProcess(f);
  ASSERT_EQ(parts.size(), 3u);  // 1, 2, 4; the skipped shell has no threads
  EXPECT_EQ(parts[0].info.id, 1u);
  EXPECT_EQ(parts[1].info.id, 2u);
  EXPECT_EQ(parts[2].info.id, 4u);
  EXPECT_EQ(parts[1].label, "pid 4243 (ruby app.rb)");
  const TraceFile& child = parts[1].trace;
  EXPECT_EQ(child.header.pid, 4243);
  EXPECT_FALSE(child.header.main_thread.has_value());
  EXPECT_EQ(parts[2].trace.header.ruby_version, "3.4.5");
  EXPECT_EQ(parts[0].trace.header.main_thread, 1u);
  ASSERT_EQ(child.threads.size(), 2u);
  EXPECT_TRUE(child.processes.empty());  // each part is a one-process trace
  size_t recording_events = 0;
  for (const TraceEvent& e : child.events) {
    if (e.ruby_thread) {
      EXPECT_TRUE(*e.ruby_thread == 2 || *e.ruby_thread == 3);
    } else {
      ++recording_events;
    }
  }
  // tracing_started (0 ms) came before the fork (1.4 ms), tracing_stopped (4 ms) after its exec (3.1 ms).
  EXPECT_EQ(recording_events, 0u);
  EXPECT_EQ(parts[2].trace.events.size(), 5u);  // its GC pair included
  size_t root_recording = 0;
  for (const TraceEvent& e : parts[0].trace.events) root_recording += e.ruby_thread ? 0 : 1;
  EXPECT_EQ(root_recording, 2u);  // the root did not end: the whole recording is its
}

TEST(SplitByProcess, OneProcessTraceIsItself) {
  const TraceFile f = ParseOk(std::string(kHeader) + R"({"thread":{"ruby_thread":1,"main":true}}
)");
  const std::vector<ProcessTrace> parts = SplitByProcess(f);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].label, "pid 10 (ruby a.rb)");
  EXPECT_EQ(parts[0].trace.threads.size(), 1u);
}

}  // namespace
}  // namespace rvbpfd

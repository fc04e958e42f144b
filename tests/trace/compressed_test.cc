// The zstd container of .rvtrace files (trace/compressed.h, docs/rvtrace.md "Compression"): the writer's zstd format
// holds exactly the plain format's lines, a file cut anywhere reads like a plain file cut at a line, and the reader
// tells the formats apart by the magic number only.
#include "trace/compressed.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <zstd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "trace/reader.h"
#include "trace/writer.h"
#include "trace_test_util.h"

namespace rvbpfd {
namespace {

using ::rvbpfd::testing::ReadAll;
using ::rvbpfd::testing::ScratchDir;
using ::rvbpfd::testing::WriteAll;

TraceHeader TestHeader() {
  return TraceHeader{
      .pid = 4242, .ruby_version = "3.4.5", .origin_ns = 1'000'000'000, .started_at = "2026-01-31T12:00:00.000000Z"};
}

// Event i of a two-thread GVL hand-off: readies, acquisitions and releases with a stack, and samples.
TraceEvent Ev(uint64_t i, uint32_t stack) {
  static constexpr EventName kCycle[] = {EventName::kWantsGvl, EventName::kGvlAcquired, EventName::kSample,
                                         EventName::kGvlReleased};
  TraceEvent e;
  e.t_ns = 1000 + i * 250;
  e.event = kCycle[i % 4];
  e.ruby_thread = 1 + static_cast<uint32_t>((i / 4) % 2);
  e.native_tid = 5000 + *e.ruby_thread;
  e.probe_tid = e.native_tid;
  e.source = e.event == EventName::kSample ? kSourcePerfEvent : kSourceThreadHookSite;
  if (e.event == EventName::kGvlReleased || e.event == EventName::kSample) e.stack = stack;
  return e;
}

// Writes `events` events in `format`, calling Flush() after each of `flush_after` events; returns the file's size
// after each of those flushes (the flush points), the size after Create first.
std::vector<size_t> WriteTrace(const std::string& path, TraceFormat format, uint64_t events,
                               const std::vector<uint64_t>& flush_after, bool finish) {
  std::vector<size_t> points;
  Result<TraceWriter> w = TraceWriter::Create(path, TestHeader(), format);
  EXPECT_TRUE(w.ok()) << w.error().ToString();
  if (!w.ok()) return points;
  points.push_back(ReadAll(path).size());
  const uint32_t f1 = w->InternFrame({"Worker#run", "/app/worker.rb", 12, FrameKind::kRuby});
  const uint32_t f2 = w->InternFrame({"<main>", "/app/main.rb", 1, FrameKind::kRuby});
  const uint32_t stack = w->InternStack(std::vector<uint32_t>{f1, f2});
  size_t next_flush = 0;
  for (uint64_t i = 0; i < events; ++i) {
    EXPECT_TRUE(w->Write(Ev(i, stack)).ok());
    if (next_flush < flush_after.size() && flush_after[next_flush] == i + 1) {
      EXPECT_TRUE(w->Flush().ok());
      points.push_back(ReadAll(path).size());
      ++next_flush;
    }
  }
  if (finish) {
    EXPECT_TRUE(w->Finish(FinishInfo{.end_t_ns = 1000 + events * 250}).ok());
  }
  return points;
}

TEST(CompressedTrace, HoldsExactlyThePlainFormatsLines) {
  ScratchDir dir;
  const std::string plain = dir.File("plain.rvtrace"), packed = dir.File("packed.rvtrace");
  // Past kFlushBytes several times, so the frames hold data zstd wrote out before they ended.
  WriteTrace(plain, TraceFormat::kJsonl, 5000, {10, 3000}, true);
  WriteTrace(packed, TraceFormat::kZstd, 5000, {10, 3000}, true);
  const std::string text = ReadAll(plain), bytes = ReadAll(packed);
  ASSERT_TRUE(LooksZstd(bytes));
  EXPECT_FALSE(LooksZstd(text));
  Result<DecompressedText> decoded = DecompressZstd(bytes, "packed", 1 << 30);
  ASSERT_TRUE(decoded.ok()) << decoded.error().ToString();
  EXPECT_FALSE(decoded->cut);
  EXPECT_EQ(decoded->text, text);
  EXPECT_LT(bytes.size() * 5, text.size()) << "compression must pay for itself on repetitive lines";

  Result<TraceFile> a = TraceReader::ReadFile(plain), b = TraceReader::ReadFile(packed);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->events.size(), a->events.size());
  EXPECT_EQ(b->lines, a->lines);
  ASSERT_TRUE(b->summary.has_value());
  EXPECT_FALSE(b->truncated_frame);
}

TEST(CompressedTrace, EveryFlushLeavesAWholeStreamAndEveryCutReadsAsAPrefix) {
  ScratchDir dir;
  const std::string path = dir.File("cut.rvtrace");
  // Flushes after few and after many events: the 1160 events (~230 KB) between the third and the fourth pass
  // kFlushBytes, so the writer hands zstd text of a frame that stays open (what zstd writes of it depends on its
  // worker thread's progress; ZstdCompressor.BlocksOfAnOpenFrameDecodeBeforeItEnds checks that it decodes).
  const std::vector<uint64_t> flush_after = {1, 2, 40, 1200, 1300};
  const std::vector<size_t> points = WriteTrace(path, TraceFormat::kZstd, 1500, flush_after, true);
  ASSERT_EQ(points.size(), flush_after.size() + 1);
  const std::string bytes = ReadAll(path);
  Result<TraceFile> full = TraceReader::ParseBytes(bytes, "full");
  ASSERT_TRUE(full.ok()) << full.error().ToString();
  const std::vector<TraceEvent>& all = full->events;

  // A file cut at a flush point has every event written before the flush, and reads as uncut.
  for (size_t k = 0; k < points.size(); ++k) {
    Result<TraceFile> part = TraceReader::ParseBytes(std::string_view(bytes).substr(0, points[k]), "at flush");
    ASSERT_TRUE(part.ok()) << "cut at flush point " << k << ": " << part.error().ToString();
    EXPECT_FALSE(part->truncated_frame) << k;
    EXPECT_FALSE(part->truncated_last_line) << k;
    const size_t expected = 1 + (k == 0 ? 0 : flush_after[k - 1]);  // tracing_started + the events before the flush
    EXPECT_EQ(part->events.size(), expected) << "cut at flush point " << k;
  }
  // Cut anywhere after the first frame: the events read are a prefix of the whole file's, never fewer than the last
  // flush point before the cut holds, and a cut inside a frame is reported.
  std::vector<size_t> cuts;
  for (size_t k = 0; k < 150; ++k) cuts.push_back(points[0] + (bytes.size() - points[0]) * k / 150);
  for (size_t p : points) {
    for (size_t d = 1; d <= 5; ++d) cuts.insert(cuts.end(), {p - d, p + d});
  }
  for (size_t cut : cuts) {
    if (cut < points[0] || cut >= bytes.size()) continue;
    Result<TraceFile> part = TraceReader::ParseBytes(std::string_view(bytes).substr(0, cut), "cut");
    ASSERT_TRUE(part.ok()) << "cut at " << cut << " of " << bytes.size() << ": " << part.error().ToString();
    ASSERT_LE(part->events.size(), all.size());
    for (size_t i = 0; i < part->events.size(); ++i) {
      ASSERT_EQ(part->events[i].t_ns, all[i].t_ns) << "cut at " << cut;
      ASSERT_EQ(part->events[i].event, all[i].event) << "cut at " << cut;
    }
    size_t floor_events = 0;
    for (size_t k = 0; k < points.size(); ++k) {
      if (points[k] <= cut) floor_events = 1 + (k == 0 ? 0 : flush_after[k - 1]);
    }
    EXPECT_GE(part->events.size(), floor_events) << "cut at " << cut;
    const bool at_point = std::find(points.begin(), points.end(), cut) != points.end();
    if (!at_point) {
      EXPECT_TRUE(part->truncated_frame) << "cut at " << cut;
    }
  }
  // Cut inside the first frame's header nothing can be read: an error like a file without a whole header line.
  EXPECT_FALSE(TraceReader::ParseBytes(std::string_view(bytes).substr(0, 8), "header cut").ok());
}

TEST(CompressedTrace, FormatIsToldByMagicNumberNotByName) {
  ScratchDir dir;
  const std::string plain = dir.File("plain.zst"), packed = dir.File("packed.jsonl");
  WriteTrace(plain, TraceFormat::kJsonl, 20, {}, true);
  WriteTrace(packed, TraceFormat::kZstd, 20, {}, true);
  Result<TraceFile> a = TraceReader::ReadFile(plain), b = TraceReader::ReadFile(packed);
  ASSERT_TRUE(a.ok()) << a.error().ToString();
  ASSERT_TRUE(b.ok()) << b.error().ToString();
  EXPECT_EQ(a->events.size(), 22u);  // tracing_started, 20, tracing_stopped
  EXPECT_EQ(b->events.size(), 22u);
}

// Any standard zstd stream of the lines reads: frames another tool wrote, concatenated, after a skippable frame.
TEST(CompressedTrace, ReadsStandardFramesOfOtherWriters) {
  ScratchDir dir;
  const std::string plain = dir.File("plain.rvtrace");
  WriteTrace(plain, TraceFormat::kJsonl, 100, {}, true);
  const std::string text = ReadAll(plain);
  auto compress = [](std::string_view part) {
    std::string out(ZSTD_compressBound(part.size()), '\0');
    const size_t n = ZSTD_compress(out.data(), out.size(), part.data(), part.size(), 9);
    EXPECT_FALSE(ZSTD_isError(n));
    out.resize(n);
    return out;
  };
  const std::string skippable("\x50\x2a\x4d\x18\x03\x00\x00\x00" "abc", 11);  // magic, length 3, content
  // Split inside a line: frames need not end at line boundaries.
  const size_t half = text.size() / 2 + 3;
  const std::string bytes = skippable + compress(text.substr(0, half)) + compress(text.substr(half));
  Result<TraceFile> r = TraceReader::ParseBytes(bytes, "other");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->events.size(), 102u);
  EXPECT_FALSE(r->truncated_frame);
}

TEST(CompressedTrace, CorruptOrOversizedDataIsRefusedNamingTheFile) {
  ScratchDir dir;
  const std::string path = dir.File("big.rvtrace");
  WriteTrace(path, TraceFormat::kZstd, 2000, {}, true);
  std::string bytes = ReadAll(path);
  Result<TraceFile> small = TraceReader::ParseBytes(bytes, "small.rvtrace", 4096);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.error().code(), ErrorCode::kBadTrace);
  EXPECT_NE(small.error().message().find("small.rvtrace"), std::string::npos) << small.error().message();
  EXPECT_NE(small.error().message().find("more than 4096 bytes"), std::string::npos) << small.error().message();

  // A flipped byte after the header frame: zstd refuses the block or the frame's checksum fails.
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
  WriteAll(path, bytes);
  Result<TraceFile> corrupt = TraceReader::ReadFile(path);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.error().code(), ErrorCode::kBadTrace);
  EXPECT_NE(corrupt.error().message().find("corrupt zstd data"), std::string::npos) << corrupt.error().message();
  // Garbage after whole frames is not a cut: refused too.
  Result<TraceFile> trailing = TraceReader::ParseBytes(ReadAll(dir.File("big.rvtrace")) + "{\"x\":1}\n", "t");
  EXPECT_FALSE(trailing.ok());
}

TEST(CompressedTrace, WriterWithoutFinishEndsItsFrame) {
  ScratchDir dir;
  const std::string path = dir.File("nofinish.rvtrace");
  {
    Result<TraceWriter> w = TraceWriter::Create(path, TestHeader(), TraceFormat::kZstd);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Write(Ev(0, 0)).ok());
  }
  Result<TraceFile> r = TraceReader::ReadFile(path);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->events.size(), 2u);
  EXPECT_FALSE(r->truncated_frame);
  EXPECT_FALSE(r->summary.has_value());
}

// What zstd writes of a frame before it ends is whole blocks, which a reader decodes: a cut file loses only the
// frame's last incomplete block. Without workers zstd writes blocks as they fill, so this is deterministic.
TEST(ZstdCompressor, BlocksOfAnOpenFrameDecodeBeforeItEnds) {
  Result<std::unique_ptr<ZstdCompressor>> c = ZstdCompressor::Create(/*workers=*/0);
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  std::string text;
  for (int i = 0; text.size() < 400'000; ++i) {
    text += "{\"t_ns\":" + std::to_string(1000 + i * 977) + ",\"ruby_thread\":" + std::to_string(1 + i % 5) + "}\n";
  }
  std::string out;
  for (size_t at = 0; at < text.size(); at += TraceWriter::kFlushBytes) {
    ASSERT_TRUE((*c)->Compress(std::string_view(text).substr(at, TraceWriter::kFlushBytes), false, &out).ok());
  }
  EXPECT_TRUE((*c)->frame_open());
  Result<DecompressedText> open = DecompressZstd(out, "open", 1 << 30);
  ASSERT_TRUE(open.ok()) << open.error().ToString();
  EXPECT_TRUE(open->cut);
  EXPECT_GT(open->text.size(), 0u) << "zstd wrote no whole block of a 400 KB frame";
  EXPECT_EQ(text.compare(0, open->text.size(), open->text), 0) << "decoded text is not a prefix of the input";

  ASSERT_TRUE((*c)->Compress("", true, &out).ok());
  EXPECT_FALSE((*c)->frame_open());
  Result<DecompressedText> whole = DecompressZstd(out, "whole", 1 << 30);
  ASSERT_TRUE(whole.ok()) << whole.error().ToString();
  EXPECT_FALSE(whole->cut);
  EXPECT_EQ(whole->text, text);
}

std::set<std::string> Tasks() {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) out.insert(e.path().filename());
  return out;
}

// zstd's worker threads never take SIGINT/SIGTERM: the recorder's main loop must (common/threads.h).
TEST(ZstdCompressor, WorkerThreadsBlockTheMainLoopsSignals) {
  sigset_t before;
  pthread_sigmask(SIG_SETMASK, nullptr, &before);
  const std::set<std::string> tasks_before = Tasks();
  Result<std::unique_ptr<ZstdCompressor>> c = ZstdCompressor::Create(/*workers=*/1);
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  std::string text, out;
  for (int i = 0; text.size() < 3'000'000; ++i) text += "{\"t_ns\":" + std::to_string(i * 7919) + "}\n";
  ASSERT_TRUE((*c)->Compress(text, false, &out).ok());
  std::vector<std::string> workers;
  for (const std::string& t : Tasks()) {
    if (!tasks_before.contains(t)) workers.push_back(t);
  }
  ASSERT_FALSE(workers.empty()) << "zstd started no worker thread";
  for (const std::string& t : workers) {
    const std::string status = ReadAll("/proc/self/task/" + t + "/status");
    const size_t at = status.find("SigBlk:");
    ASSERT_NE(at, std::string::npos);
    const uint64_t blocked = std::stoull(status.substr(at + 7), nullptr, 16);
    EXPECT_TRUE(blocked & (1ull << (SIGINT - 1))) << "worker " << t << " takes SIGINT";
    EXPECT_TRUE(blocked & (1ull << (SIGTERM - 1))) << "worker " << t << " takes SIGTERM";
  }
  sigset_t after;
  pthread_sigmask(SIG_SETMASK, nullptr, &after);
  EXPECT_EQ(sigismember(&after, SIGINT), sigismember(&before, SIGINT)) << "the caller's mask was not restored";
  EXPECT_EQ(sigismember(&after, SIGTERM), sigismember(&before, SIGTERM));
  ASSERT_TRUE((*c)->Compress("", true, &out).ok());
}

}  // namespace
}  // namespace rvbpfd

#include "model/endpoint.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/rails_stacks.h"

namespace rvbpfd {
namespace {

FrameInfo Ruby(std::string label, std::string path = "/app/app.rb", int32_t line = 1) {
  return FrameInfo{std::move(label), std::move(path), line, FrameKind::kRuby};
}
FrameInfo Cfunc(std::string label) { return FrameInfo{std::move(label), "<cfunc>", 0, FrameKind::kCfunc}; }

// A Sidekiq 7.3 processor thread running a job (labels and lines of sidekiq-7.3.2/lib/sidekiq/processor.rb), leaf
// first, below the job's own frames.
std::vector<FrameInfo> SidekiqStack(std::vector<FrameInfo> job) {
  const std::string p = "/usr/share/rubygems-integration/all/gems/sidekiq-7.3.2/lib/sidekiq/processor.rb";
  std::vector<FrameInfo> s = std::move(job);
  for (FrameInfo f : {Ruby("Sidekiq::Processor#execute_job", p, 220), Ruby("Sidekiq::Processor#process", p, 185),
                      Ruby("Sidekiq::Middleware::Chain#invoke",
                           "/usr/share/rubygems-integration/all/gems/sidekiq-7.3.2/lib/sidekiq/middleware/chain.rb",
                           180),
                      Ruby("Sidekiq::Processor#process", p, 184), Ruby("Sidekiq::Processor#dispatch", p, 145),
                      Ruby("Sidekiq::Processor#process_one", p, 87), Ruby("Sidekiq::Processor#run", p, 77)}) {
    s.push_back(std::move(f));
  }
  return s;
}

TEST(EndpointTest, RailsActionOfRealStacks) {
  // On CPU in the action's own work, 63 frames deep under Puma, Rack middleware and Rails' dispatch.
  EXPECT_EQ(DeriveEndpoint(rails_stacks::kRailsCpu),
            (Endpoint{"LedgerController#cpu", EndpointRule::kRailsAction}));
  // Blocked in Kernel#sleep and in Thread::Mutex#synchronize (the reasons' stacks).
  EXPECT_EQ(DeriveEndpoint(rails_stacks::kRailsNap).name, "LedgerController#nap");
  EXPECT_EQ(DeriveEndpoint(rails_stacks::kRailsLocked).name, "LedgerController#locked");
}

TEST(EndpointTest, NoActionFrameIsNoEndpoint) {
  // The implicit render after the action returned: send_action's after part calls Rails' own code, not an action.
  EXPECT_EQ(DeriveEndpoint(rails_stacks::kRailsImplicitRender), Endpoint{});
  // Puma's idle pool thread and its reactor: outside any request.
  EXPECT_EQ(DeriveEndpoint(rails_stacks::kPumaIdle).name, "-");
  EXPECT_EQ(DeriveEndpoint(rails_stacks::kPumaReactor).rule, EndpointRule::kNone);
  EXPECT_EQ(DeriveEndpoint(std::span<const FrameInfo>()), Endpoint{});
}

TEST(EndpointTest, RailsActionCalledThroughSend) {
  // A plain ActionController::Metal: process_action calls the action through a send C frame.
  std::vector<FrameInfo> s = {Cfunc("Kernel#sleep"), Ruby("Api::PingController#show"), Cfunc("Kernel#send"),
                              Ruby("AbstractController::Base#process_action"),
                              Ruby("AbstractController::Base#process")};
  EXPECT_EQ(DeriveEndpoint(s), (Endpoint{"Api::PingController#show", EndpointRule::kRailsAction}));
  // A block of the action called by the dispatch is not the action (the stack is cut below it: no endpoint).
  s = {Ruby("block in Api::PingController#show"), Ruby("AbstractController::Base#process_action")};
  EXPECT_EQ(DeriveEndpoint(s).rule, EndpointRule::kNone);
  // A C method as the callee names nothing.
  s = {Cfunc("Kernel#tap"), Ruby("ActionController::BasicImplicitRender#send_action")};
  EXPECT_EQ(DeriveEndpoint(s).rule, EndpointRule::kNone);
}

TEST(EndpointTest, SidekiqJob) {
  const std::vector<FrameInfo> s =
      SidekiqStack({Cfunc("Kernel#sleep"), Ruby("LedgerPostingJob#perform", "/app/jobs.rb", 22)});
  EXPECT_EQ(DeriveEndpoint(s), (Endpoint{"LedgerPostingJob", EndpointRule::kSidekiqJob}));
  // Deeper in the job's own code, the job is still the one execute_job called.
  const std::vector<FrameInfo> deeper = SidekiqStack(
      {Ruby("Reports::Mailer#perform"), Ruby("LedgerPostingJob#deliver"), Ruby("LedgerPostingJob#perform")});
  EXPECT_EQ(DeriveEndpoint(deeper).name, "LedgerPostingJob");
  // Sidekiq's middleware before the job's perform: no job frame yet.
  const std::vector<FrameInfo> middleware = {Ruby("Sidekiq::Processor#process"), Ruby("Sidekiq::Processor#run")};
  EXPECT_EQ(DeriveEndpoint(middleware), Endpoint{});
}

TEST(EndpointTest, ActiveJobThroughSidekiq) {
  // Sidekiq's ActiveJob wrapper is skipped; the job is what ActiveJob's _perform_job block calls (3.4 labels it
  // "block in", 3.3 as the method).
  for (const std::string block : {"block in ActiveJob::Execution#_perform_job", "ActiveJob::Execution#_perform_job"}) {
    const std::vector<FrameInfo> s = SidekiqStack({
        Ruby("InvoiceJob#perform", "/app/jobs/invoice_job.rb", 4),
        Ruby(block),
        Ruby("ActiveSupport::Callbacks#run_callbacks"),
        Ruby("ActiveJob::Execution#_perform_job"),
        Ruby("ActiveJob::Execution#perform_now"),
        Ruby("ActiveJob::Execution::ClassMethods#execute"),
        Ruby("Sidekiq::ActiveJob::Wrapper#perform"),
    });
    EXPECT_EQ(DeriveEndpoint(s), (Endpoint{"InvoiceJob", EndpointRule::kActiveJob})) << block;
  }
}

TEST(EndpointTest, OutermostUnitOfWorkWins) {
  // A job performed inline inside an action belongs to the action.
  std::vector<FrameInfo> s = {Ruby("InvoiceJob#perform"), Ruby("ActiveJob::Execution#_perform_job"),
                              Ruby("ActiveJob::Execution#perform_now"), Ruby("InvoicesController#create"),
                              Ruby("ActionController::BasicImplicitRender#send_action"),
                              Ruby("AbstractController::Base#process_action")};
  EXPECT_EQ(DeriveEndpoint(s).name, "InvoicesController#create");
}

TEST(EndpointTest, SinatraRoute) {
  std::vector<FrameInfo> s = {Cfunc("IO#read"), Ruby("App#GET /users/:id"), Ruby("Sinatra::Base#route_eval"),
                              Ruby("Sinatra::Base#process_route")};
  EXPECT_EQ(DeriveEndpoint(s), (Endpoint{"GET /users/:id", EndpointRule::kSinatraRoute}));
  // Not a route: no path after the verb, or not a method label.
  s = {Ruby("App#GET"), Ruby("App#POSTAL /x"), Ruby("block in App#GET /x")};
  EXPECT_EQ(DeriveEndpoint(s).rule, EndpointRule::kNone);
}

TEST(EndpointTest, UnknownFramesMatchNothing) {
  const FrameInfo action = Ruby("LedgerController#cpu");
  const FrameInfo dispatch = Ruby("AbstractController::Base#process_action");
  std::vector<const FrameInfo*> s = {&action, nullptr, &dispatch};
  EXPECT_EQ(DeriveEndpoint(std::span<const FrameInfo* const>(s)).rule, EndpointRule::kNone);
  s = {nullptr, &dispatch};
  EXPECT_EQ(DeriveEndpoint(std::span<const FrameInfo* const>(s)).rule, EndpointRule::kNone);
  s = {&action, &dispatch, nullptr};
  EXPECT_EQ(DeriveEndpoint(std::span<const FrameInfo* const>(s)).name, "LedgerController#cpu");
}

TEST(EndpointTest, TraceEndpointsDeriveOncePerStack) {
  TraceFile t;
  uint32_t id = 1;
  std::vector<uint32_t> cpu, idle;
  for (const FrameInfo& f : rails_stacks::kRailsCpu) {
    t.frames.emplace(id, f);
    cpu.push_back(id++);
  }
  for (const FrameInfo& f : rails_stacks::kPumaIdle) {
    t.frames.emplace(id, f);
    idle.push_back(id++);
  }
  t.stacks.emplace(1, cpu);
  t.stacks.emplace(2, idle);
  t.stacks.emplace(3, cpu);
  TraceEndpoints e(t);
  EXPECT_EQ(e.Of(0), 0u);
  EXPECT_EQ(e.Of(2), 0u);
  EXPECT_EQ(e.Of(99), 0u);
  const uint32_t a = e.Of(1);
  EXPECT_NE(a, 0u);
  EXPECT_EQ(e.Of(3), a);  // the same endpoint, one id
  EXPECT_EQ(e.endpoint(a).name, "LedgerController#cpu");
  EXPECT_EQ(e.endpoint(0).name, "-");
  EXPECT_EQ(e.size(), 2u);
}

// A class named by two rules (performed through Sidekiq and through ActiveJob) keeps each rule with its own stacks.
TEST(EndpointTest, TraceEndpointsKeepEachRuleOfOneName) {
  TraceFile t;
  uint32_t id = 1;
  auto add_stack = [&](uint32_t stack_id, const std::vector<FrameInfo>& frames) {
    std::vector<uint32_t> ids;
    for (const FrameInfo& f : frames) {
      t.frames.emplace(id, f);
      ids.push_back(id++);
    }
    t.stacks.emplace(stack_id, ids);
  };
  add_stack(1, SidekiqStack({Ruby("InvoiceJob#perform")}));
  add_stack(2, {Ruby("InvoiceJob#perform"), Ruby("ActiveJob::Execution#_perform_job"), Ruby("Runner#run")});
  TraceEndpoints e(t);
  const Endpoint sidekiq = e.OfStack(1);  // copies: a new id may move the table
  const Endpoint active = e.OfStack(2);
  EXPECT_EQ(sidekiq, (Endpoint{"InvoiceJob", EndpointRule::kSidekiqJob}));
  EXPECT_EQ(active, (Endpoint{"InvoiceJob", EndpointRule::kActiveJob}));
  EXPECT_NE(e.Of(1), e.Of(2));
}

TEST(EndpointTest, RuleNames) {
  EXPECT_EQ(EndpointRuleName(EndpointRule::kRailsAction), "rails_action");
  EXPECT_EQ(EndpointRuleName(EndpointRule::kSinatraRoute), "sinatra_route");
  EXPECT_EQ(EndpointRuleName(EndpointRule::kCount), "?");
}

}  // namespace
}  // namespace rvbpfd

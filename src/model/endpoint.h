// Endpoints: the unit of work a Ruby stack belongs to — the Rails controller action being dispatched, the Sidekiq or
// ActiveJob job class being performed, a Sinatra route — derived from the stack's frames as rb_profile_frames names
// them (docs/design.md, "Endpoints"). One rule, here, computed once per distinct stack and read by every output:
// the pprof export's and the fleet agent's `endpoint` label, inspect's endpoint section, the Perfetto args and the
// report's endpoint filter.
//
// The rule. The frames are scanned from the outermost (the thread's root) inward; the first dispatch frame that
// names a unit of work decides (so a job performed inline inside an action belongs to the action):
//   - rails_action: a Rails dispatch frame (AbstractController::Base#process_action,
//     ActionController::BasicImplicitRender#send_action or AbstractController::Base#send_action); the frame it calls
//     directly (past Kernel#send / BasicObject#__send__ / Kernel#public_send C frames) is the action when it is a
//     program method frame "Class#method" (not a block, not a C or <internal:...> frame, not Rails' own
//     ActionController::, AbstractController::, ActionView::, ActionDispatch:: or ActiveSupport:: code): the
//     endpoint is that label, e.g. "LedgerController#cpu". Time in before/after callbacks and in the implicit render
//     after the action returned has no action frame on the stack and is not named.
//   - sidekiq_job: Sidekiq::Processor#execute_job; the frame it calls directly is "Class#perform": the endpoint is
//     "Class" (ActiveJob's Sidekiq wrappers are skipped: the ActiveJob rule below names the job inside them).
//   - active_job: ActiveJob::Execution#_perform_job or #perform_now (or a block in them, which CRuby 3.3 labels as
//     the method); the frame it calls directly is "Class#perform": the endpoint is "Class".
//   - sinatra_route: a program frame whose method is a Sinatra route, "Class#VERB /path" (Sinatra defines each route
//     as a method named "GET /path"): the endpoint is "VERB /path". Only where the stack names it so.
// Nothing else: "-" (a thread outside any request or job, Puma's reactor and idle pool threads, Rack middleware, or
// request time no rule names). The endpoint is derived, never observed: every output that shows it says so (the
// docs, and the rule with it where the format has room).
//
// Work is bounded by the stack's length (frames are bounded by the recorder) times a constant; no allocation but the
// result's name. Frames may be null (a frame id a trace does not define): such a frame matches no rule.
#ifndef RVBPFD_SRC_MODEL_ENDPOINT_H_
#define RVBPFD_SRC_MODEL_ENDPOINT_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "trace/reader.h"
#include "trace/stacks.h"

namespace rvbpfd {

// Which rule named an endpoint; kNone for "-". Values index name tables; keep kCount last.
enum class EndpointRule : uint8_t { kNone, kRailsAction, kSidekiqJob, kActiveJob, kSinatraRoute, kCount };
// "none", "rails_action", "sidekiq_job", "active_job", "sinatra_route".
std::string_view EndpointRuleName(EndpointRule rule);

// The endpoint of a stack outside any unit of work.
inline constexpr std::string_view kNoEndpoint = "-";

struct Endpoint {
  std::string name{kNoEndpoint};
  EndpointRule rule = EndpointRule::kNone;
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

// The rule above over one stack, leaf first.
Endpoint DeriveEndpoint(std::span<const FrameInfo* const> frames);
Endpoint DeriveEndpoint(std::span<const FrameInfo> frames);

// The endpoints of a trace's stacks, each derived once on first use, one id per (name, rule). Ids are dense from 0;
// id 0 is always "-".
// Not thread-safe; the trace (or the dictionaries) must outlive the table.
class TraceEndpoints {
 public:
  explicit TraceEndpoints(const TraceFile& trace) : TraceEndpoints(trace.frames, trace.stacks) {}
  // A trace's frame and stack dictionaries (TraceFile::frames, stacks).
  TraceEndpoints(const std::unordered_map<uint32_t, FrameInfo>& frames,
                 const std::unordered_map<uint32_t, std::vector<uint32_t>>& stacks);
  // The endpoint id of stack `stack_id` (0, an unknown id or an empty stack: 0).
  uint32_t Of(uint32_t stack_id);
  const Endpoint& endpoint(uint32_t id) const { return endpoints_[id < endpoints_.size() ? id : 0]; }
  const Endpoint& OfStack(uint32_t stack_id) { return endpoint(Of(stack_id)); }
  size_t size() const { return endpoints_.size(); }

 private:
  const std::unordered_map<uint32_t, FrameInfo>& frames_;
  const std::unordered_map<uint32_t, std::vector<uint32_t>>& stacks_;
  std::vector<Endpoint> endpoints_;
  static std::string Key(const Endpoint& e);
  std::unordered_map<std::string, uint32_t> ids_;  // by Key: name and rule
  std::unordered_map<uint32_t, uint32_t> of_stack_;
  std::vector<const FrameInfo*> scratch_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_MODEL_ENDPOINT_H_

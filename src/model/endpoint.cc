#include "model/endpoint.h"

#include <array>

namespace rvbpfd {
namespace {

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

enum class Dispatch : uint8_t { kNone, kRails, kSidekiq, kActiveJob };

// The dispatch frame a label names (a block in a dispatch method counts: CRuby 3.4 prefixes it "block in ", 3.3
// labels it as the method).
Dispatch DispatchOf(const FrameInfo& f) {
  if (f.kind != FrameKind::kRuby) return Dispatch::kNone;
  std::string_view l = f.label;
  if (StartsWith(l, "block ")) {
    const size_t in = l.find(" in ");
    if (in == std::string_view::npos) return Dispatch::kNone;
    l = l.substr(in + 4);
  }
  if (l == "AbstractController::Base#process_action" || l == "ActionController::BasicImplicitRender#send_action" ||
      l == "AbstractController::Base#send_action") {
    return Dispatch::kRails;
  }
  if (l == "Sidekiq::Processor#execute_job") return Dispatch::kSidekiq;
  if (l == "ActiveJob::Execution#_perform_job" || l == "ActiveJob::Execution#perform_now") return Dispatch::kActiveJob;
  return Dispatch::kNone;
}

// The C frames of a dynamic call between a dispatch frame and the method it calls.
bool IsSendFrame(const FrameInfo& f) {
  return f.kind == FrameKind::kCfunc &&
         (f.label == "Kernel#send" || f.label == "BasicObject#__send__" || f.label == "Kernel#public_send");
}

// A method frame of program code: "Class#method", a Ruby frame, not a block, not CRuby's library.
bool IsProgramMethod(const FrameInfo& f) {
  if (f.kind != FrameKind::kRuby || IsVmLibraryFrame(f)) return false;
  const std::string_view l = f.label;
  if (l.empty() || StartsWith(l, "block ") || l.front() == '<') return false;
  const size_t hash = l.find('#');
  return hash != std::string_view::npos && hash > 0 && hash + 1 < l.size();
}

bool IsRailsFrameworkLabel(std::string_view l) {
  for (std::string_view p : {"ActionController::", "AbstractController::", "ActionView::", "ActionDispatch::",
                             "ActiveSupport::"}) {
    if (StartsWith(l, p)) return true;
  }
  return false;
}

// "Class" of a "Class#perform" program frame that is a job's, or empty.
std::string_view JobClassOf(const FrameInfo& f) {
  if (!IsProgramMethod(f) || !EndsWith(f.label, "#perform")) return {};
  const std::string_view cls = std::string_view(f.label).substr(0, f.label.size() - 8);
  // ActiveJob's adapters for Sidekiq: the job they wrap is named by the ActiveJob rule further in.
  if (cls == "Sidekiq::ActiveJob::Wrapper" || cls == "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper") return {};
  return cls;
}

// The endpoint the dispatch frame at `d` names, or kNone: the frame it calls directly (past send frames).
Endpoint FromDispatch(std::span<const FrameInfo* const> frames, size_t d, Dispatch kind) {
  size_t k = d;
  while (k > 0 && frames[k - 1] != nullptr && IsSendFrame(*frames[k - 1])) --k;
  if (k == 0 || frames[k - 1] == nullptr) return {};
  const FrameInfo& callee = *frames[k - 1];
  switch (kind) {
    case Dispatch::kRails:
      if (IsProgramMethod(callee) && !IsRailsFrameworkLabel(callee.label)) {
        return Endpoint{callee.label, EndpointRule::kRailsAction};
      }
      return {};
    case Dispatch::kSidekiq:
    case Dispatch::kActiveJob: {
      const std::string_view cls = JobClassOf(callee);
      if (cls.empty()) return {};
      return Endpoint{std::string(cls), kind == Dispatch::kSidekiq ? EndpointRule::kSidekiqJob
                                                                    : EndpointRule::kActiveJob};
    }
    case Dispatch::kNone:
      break;
  }
  return {};
}

// "VERB /path" when the frame is a program method named as a Sinatra route, else empty.
std::string_view SinatraRouteOf(const FrameInfo& f) {
  if (!IsProgramMethod(f)) return {};
  const std::string_view l = f.label;
  const std::string_view method = l.substr(l.find('#') + 1);
  for (std::string_view verb : {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "LINK", "UNLINK"}) {
    if (method.size() > verb.size() + 1 && StartsWith(method, verb) && method[verb.size()] == ' ' &&
        method[verb.size() + 1] == '/') {
      return method;
    }
  }
  return {};
}

constexpr std::array<std::string_view, static_cast<size_t>(EndpointRule::kCount)> kRuleNames = {
    "none", "rails_action", "sidekiq_job", "active_job", "sinatra_route"};

}  // namespace

std::string_view EndpointRuleName(EndpointRule rule) {
  const auto i = static_cast<size_t>(rule);
  return i < kRuleNames.size() ? kRuleNames[i] : "?";
}

Endpoint DeriveEndpoint(std::span<const FrameInfo* const> frames) {
  for (size_t i = frames.size(); i-- > 0;) {
    if (frames[i] == nullptr) continue;
    const FrameInfo& f = *frames[i];
    if (const Dispatch d = DispatchOf(f); d != Dispatch::kNone) {
      Endpoint e = FromDispatch(frames, i, d);
      if (e.rule != EndpointRule::kNone) return e;
      continue;
    }
    if (const std::string_view route = SinatraRouteOf(f); !route.empty()) {
      return Endpoint{std::string(route), EndpointRule::kSinatraRoute};
    }
  }
  return {};
}

Endpoint DeriveEndpoint(std::span<const FrameInfo> frames) {
  std::vector<const FrameInfo*> ptrs;
  ptrs.reserve(frames.size());
  for (const FrameInfo& f : frames) ptrs.push_back(&f);
  return DeriveEndpoint(std::span<const FrameInfo* const>(ptrs));
}

TraceEndpoints::TraceEndpoints(const std::unordered_map<uint32_t, FrameInfo>& frames,
                               const std::unordered_map<uint32_t, std::vector<uint32_t>>& stacks)
    : frames_(frames), stacks_(stacks) {
  endpoints_.emplace_back();
  ids_.emplace(Key(endpoints_.back()), 0);
}

// One id per (name, rule): a class named by two rules (a job performed both through Sidekiq and through ActiveJob)
// keeps each rule with its stacks.
std::string TraceEndpoints::Key(const Endpoint& e) {
  std::string key = e.name;
  key += '\0';
  key += static_cast<char>('0' + static_cast<int>(e.rule));
  return key;
}

uint32_t TraceEndpoints::Of(uint32_t stack_id) {
  if (stack_id == 0) return 0;
  if (auto it = of_stack_.find(stack_id); it != of_stack_.end()) return it->second;
  uint32_t id = 0;
  if (auto stack = stacks_.find(stack_id); stack != stacks_.end() && !stack->second.empty()) {
    scratch_.clear();
    for (uint32_t f : stack->second) {
      auto frame = frames_.find(f);
      scratch_.push_back(frame != frames_.end() ? &frame->second : nullptr);
    }
    Endpoint e = DeriveEndpoint(std::span<const FrameInfo* const>(scratch_));
    auto [it, fresh] = ids_.emplace(Key(e), static_cast<uint32_t>(endpoints_.size()));
    if (fresh) endpoints_.push_back(std::move(e));
    id = it->second;
  }
  of_stack_.emplace(stack_id, id);
  return id;
}

}  // namespace rvbpfd

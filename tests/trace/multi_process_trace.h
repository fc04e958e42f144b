// A hand-made multi-process trace (docs/rvtrace.md, "Process lines"), as rvbpfd writes one when it follows a launched
// command's process tree: the root (pid 4242) forks a Ruby child (pid 4243, two threads) and a shell that is not
// traced (pid 4244); the child later execs into another Ruby image (process 4, same pid). Threads of the root and of
// the child hold their own GVLs at the same time (1.5-3.0 ms), which one process's trace could never show; in the
// child, Thread #3 waits 0.7 ms for its own process's GVL.
#ifndef RVBPFD_TESTS_TRACE_MULTI_PROCESS_TRACE_H_
#define RVBPFD_TESTS_TRACE_MULTI_PROCESS_TRACE_H_

#include <string_view>

namespace rvbpfd::testing {

inline constexpr std::string_view kMultiProcessTrace =
    R"({"rvtrace":1,"recorder":"rvbpfd","recorder_version":"0.1.0","pid":4242,"ruby_version":"3.3.8","clock":"monotonic","origin_ns":1000,"started_at":"2026-12-07T20:00:00.000000Z","channels":["thread_hook_site","perf_event"],"main_thread":1,"command":["ruby","app.rb"],"sample_hz":1000,"stacks":"release"}
{"t_ns":0,"ruby_thread":null,"native_tid":null,"probe_tid":null,"event":"tracing_started","source":"daemon"}
{"process":{"id":1,"pid":4242,"t_ns":0,"command":["ruby","app.rb"],"ruby_version":"3.3.8"}}
{"frame":{"id":1,"label":"<main>","path":"/app/app.rb","line":1,"kind":"ruby"}}
{"frame":{"id":2,"label":"Worker#run","path":"/app/worker.rb","line":7,"kind":"ruby"}}
{"stack":{"id":1,"frames":[1]}}
{"stack":{"id":2,"frames":[2,1]}}
{"thread":{"ruby_thread":1,"main":true,"native_name":"ruby"}}
{"t_ns":1000000,"ruby_thread":1,"native_tid":4242,"probe_tid":4242,"event":"gvl_acquired","source":"thread_hook_site"}
{"t_ns":1200000,"ruby_thread":1,"native_tid":4242,"probe_tid":4242,"event":"sample","source":"perf_event","stack":1}
{"process":{"id":2,"pid":4243,"parent":1,"cause":"fork","t_ns":1400000,"command":["ruby","app.rb"],"ruby_version":"3.3.8","build_id":"ab12"}}
{"thread":{"ruby_thread":2,"main":true,"process":2,"native_name":"ruby"}}
{"t_ns":1500000,"ruby_thread":2,"native_tid":4243,"probe_tid":4243,"event":"gvl_acquired","source":"thread_hook_site"}
{"t_ns":1600000,"ruby_thread":2,"native_tid":4243,"probe_tid":4243,"event":"sample","source":"perf_event","stack":2}
{"thread":{"ruby_thread":3,"main":false,"process":2,"name":"worker"}}
{"t_ns":1700000,"ruby_thread":3,"native_tid":4245,"probe_tid":4243,"event":"thread_started","source":"thread_hook_site"}
{"t_ns":1800000,"ruby_thread":3,"native_tid":4245,"probe_tid":4245,"event":"wants_gvl","source":"thread_hook_site"}
{"process":{"id":3,"pid":4244,"parent":1,"cause":"fork","t_ns":1900000,"command":["/bin/sh","-c","true"],"skipped":"not Ruby: /bin/sh"}}
{"process_end":{"id":3,"t_ns":2000000,"how":"exit","exit_code":0}}
{"t_ns":2500000,"ruby_thread":2,"native_tid":4243,"probe_tid":4243,"event":"gvl_released","source":"thread_hook_site","stack":2}
{"t_ns":2500000,"ruby_thread":3,"native_tid":4245,"probe_tid":4245,"event":"gvl_acquired","source":"thread_hook_site"}
{"t_ns":2600000,"ruby_thread":3,"native_tid":4245,"probe_tid":4245,"event":"sample","source":"perf_event","stack":2}
{"t_ns":2800000,"ruby_thread":3,"native_tid":4245,"probe_tid":4245,"event":"thread_exited","source":"thread_hook_site"}
{"t_ns":3000000,"ruby_thread":1,"native_tid":4242,"probe_tid":4242,"event":"gvl_released","source":"thread_hook_site","stack":1}
{"process_end":{"id":2,"t_ns":3100000,"how":"exec"}}
{"process":{"id":4,"pid":4243,"parent":2,"cause":"exec","t_ns":3100000,"command":["ruby","other.rb"],"ruby_version":"3.4.5"}}
{"thread":{"ruby_thread":4,"main":true,"process":4}}
{"t_ns":3200000,"ruby_thread":4,"native_tid":4243,"probe_tid":4243,"event":"gvl_acquired","source":"thread_hook_site"}
{"t_ns":3300000,"ruby_thread":4,"native_tid":4243,"probe_tid":4243,"event":"sample","source":"perf_event","stack":1}
{"t_ns":3400000,"ruby_thread":null,"native_tid":4243,"probe_tid":4243,"event":"gc_enter","source":"gc_hook_site"}
{"t_ns":3450000,"ruby_thread":null,"native_tid":4243,"probe_tid":4243,"event":"gc_exit","source":"gc_hook_site"}
{"t_ns":3500000,"ruby_thread":4,"native_tid":4243,"probe_tid":4243,"event":"gvl_released","source":"thread_hook_site"}
{"process_end":{"id":4,"t_ns":3600000,"how":"exit","exit_code":3}}
{"t_ns":4000000,"ruby_thread":null,"native_tid":null,"probe_tid":null,"event":"tracing_stopped","source":"daemon","reason":"target exited"}
)";

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_TRACE_MULTI_PROCESS_TRACE_H_

/* The per-CPU counters of the BPF programs, declared once. Every place that lists them is generated from these
 * tables: the struct rv_counters both sides share (abi.h), the daemon's sum over CPUs (src/probe/bpf_session.cc),
 * the trace summary's trap counters and sample_ec_routes (src/trace), the recorder's closing lines on stderr and the
 * fleet agent's rvbpfd_dropped_total series on /metrics.
 *
 * Each group is an X-macro: X(field, fold, label, ...) per counter, in struct order. Every counter is a __u64.
 *   field  the member of struct rv_counters
 *   fold   how the daemon combines the CPUs' values: RV_FOLD_SUM or RV_FOLD_MAX
 *   label  how the recorder's stderr lines name it; "" leaves it out of them
 * and, per group, what follows the label (below). A consumer that needs every counter takes RV_COUNTERS. */
#ifndef RVBPFD_INCLUDE_RVBPFD_COUNTERS_H_
#define RVBPFD_INCLUDE_RVBPFD_COUNTERS_H_

/* Ring buffer records of scheduler, GC and process events. After the label: the `reason` label of the agent's
 * rvbpfd_dropped_total for a loss counter, "" for the others. */
#define RV_EVENT_COUNTERS(X)                                                                                        \
  X(events, RV_FOLD_SUM, "events", "")                   /* records submitted */                                   \
  X(dropped, RV_FOLD_SUM, "dropped", "ring_full_events") /* reservations that failed: each is one lost event */     \
  X(ring_high_water, RV_FOLD_MAX, "", "") /* bytes of unconsumed data seen in the ring right after a submit */

/* On-CPU samples of the perf_event program; kept apart from the events, so a lost sample is never reported as a lost
 * event. After the label: as in RV_EVENT_COUNTERS. */
#define RV_SAMPLE_COUNTERS(X)                                                                                       \
  X(samples, RV_FOLD_SUM, "samples", "")                                 /* samples submitted (not in `events`) */ \
  X(samples_dropped, RV_FOLD_SUM, "lost to a full ring", "ring_full_samples") /* samples lost to a full ring */

/* Samples of target threads by the route that found their EC (enum rv_ec_route), counted before the ring write, so a
 * sample later lost to a full ring still counts. After the label: the route's key in the trace summary's
 * sample_ec_routes object (and the member of SampleEcRoutes, src/trace/summary.h). */
#define RV_EC_ROUTE_COUNTERS(X)                                                                                     \
  X(samples_ec_tls, RV_FOLD_SUM, "tls", tls)                   /* the sampled thread's own ruby_current_ec */      \
  X(samples_ec_ractor, RV_FOLD_SUM, "ractor", ractor)          /* the main ractor's running EC (the GVL holder) */ \
  X(samples_ec_current_th, RV_FOLD_SUM, "current_th", current_th) /* the thread the last event here named */       \
  X(samples_no_ec, RV_FOLD_SUM, "none (dropped)", none) /* dropped: no route gave an EC (e.g. the timer thread) */

/* GVL readings of samples (bpf/ruby_gvl.h): samples that carried one, and of those, readings whose queue could not be
 * listed whole (longer than RV_GVL_MAX_QUEUED, or a node unreadable): their count is the VM's, their names the first
 * ones. The trace summary writes each under its field name. Nothing follows the label. */
#define RV_GVL_COUNTERS(X)                                                                                          \
  X(gvl_readings, RV_FOLD_SUM, "GVL readings")                                                                     \
  X(gvl_queue_truncated, RV_FOLD_SUM, "GVL queues listed in part")

/* Uprobe hits of a target process (past the pid filter): each one int3 trap the target paid for, whether or not it
 * became a record; the --max-overhead budget's input (records undercount traps). The trace summary writes each under
 * its field name. Nothing follows the label. */
#define RV_TRAP_COUNTERS(X)                                                                                         \
  X(probe_hits, RV_FOLD_SUM, "probe hits")                                                                         \
  /* Of those, hits that are not events: a function-entry site reached from an excluded caller (rb_mutex_lock called \
   * by rb_mutex_synchronize, i.e. every IO#write in a shared libruby), an unreadable register set. */              \
  X(hits_discarded, RV_FOLD_SUM, "not events")                                                                     \
  /* Of probe_hits, the cold ones (rv_config.cold_gap_ns), and those at RV_SITE_SINGLE_STEP sites. */               \
  X(cold_hits, RV_FOLD_SUM, "")                                                                                    \
  X(stepped_hits, RV_FOLD_SUM, "")                                                                                 \
  /* Of those, READYs that found another thread holding the GVL and carried its stack (rv_config.holder_stacks). */ \
  X(holder_stacks, RV_FOLD_SUM, "")

/* Time the BPF programs spent in the targets' context walking and writing Ruby stacks, in ns: rv_pid_traps.stack_ns
 * over every target. Nothing follows the label. */
#define RV_COST_COUNTERS(X) X(stack_ns, RV_FOLD_SUM, "")

#define RV_COUNTERS(X)                                                                                  \
  RV_EVENT_COUNTERS(X) RV_SAMPLE_COUNTERS(X) RV_EC_ROUTE_COUNTERS(X) RV_TRAP_COUNTERS(X) RV_COST_COUNTERS(X) \
  RV_GVL_COUNTERS(X)

/* Number of counters (each one __u64 of struct rv_counters). */
#define RV_COUNTER_ONE(field, fold, label, ...) +1
enum { RV_COUNTER_COUNT = 0 RV_COUNTERS(RV_COUNTER_ONE) };
#undef RV_COUNTER_ONE

#endif /* RVBPFD_INCLUDE_RVBPFD_COUNTERS_H_ */

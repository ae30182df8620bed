// Persistent-kernel scheduler: ticket fetch, counter wait / signal, watchdog,
// trace.  The only code that knows tickets and counters.
//
// State words (int32, each on its own 128-byte line, COUNTER_STRIDE apart):
//   HEAD   next ticket (atomicAdd)
//   EXIT   blocks that have left the loop
//   ABORT  set by a block whose wait timed out; every block checks it while
//          waiting and with each ticket it takes, and leaves
//   BREAK  debug: a counter index whose need is raised by one for the next
//          launch only (-1: none), so its waiters time out
//   STATUS first watchdog report of the launch in flight: flag, ticket, task, counter,
//          value, need; FIRED counts the launches that fired (the last block to leave
//          adds FLAG to it and clears FLAG, so each launch reports on its own)
//
// No host reset between launches: counters count up from zero within a launch
// (a task is ready when its counter >= need), and the last block to leave
// (EXIT reaches gridDim.x) sets the counters, HEAD, EXIT, ABORT and BREAK back
// to their initial values.  Launches in one stream are ordered, so the next
// launch (also a CUDA-graph replay) starts from a clean state.
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace mw {

// STATE_* offsets, STATUS_* fields and STATE_WORDS come from generated_tasks.cuh
// (megawino/core/abi.py).

__device__ __forceinline__ int ld_volatile(const int* p) {
  return *reinterpret_cast<const volatile int*>(p);
}

// Shared-memory slot of one block: the task in hand.
struct SchedSlot {
  int ticket;                 // -1: leave the loop
  int rec[REC_FIELDS];
};

// Thread 0 only: record a timeout (first one wins) and raise ABORT.
__device__ __forceinline__ void sched_report_timeout(const Params& p, int ticket, int counter,
                                                     unsigned value, unsigned need) {
  int* state = reinterpret_cast<int*>(p.state);
  if (atomicCAS(state + STATE_STATUS + STATUS_FLAG, 0, 1) == 0) {
    state[STATE_STATUS + STATUS_TICKET] = ticket;
    state[STATE_STATUS + STATUS_TASK] = reinterpret_cast<const int*>(p.mapping)[ticket];
    state[STATE_STATUS + STATUS_COUNTER] = counter;
    state[STATE_STATUS + STATUS_VALUE] = static_cast<int>(value);
    state[STATE_STATUS + STATUS_NEED] = static_cast<int>(need);
  }
  __threadfence();
  atomicExch(state + STATE_ABORT, 1);
}

// Thread 0 only: wait until counter >= need.  False: abort (timeout here or elsewhere).
// ``break_counter`` is the BREAK word, read once per ticket.
__device__ __forceinline__ bool sched_wait(const Params& p, int ticket, int counter,
                                           int need, int break_counter) {
  if (counter < 0) return true;
  const int* state = reinterpret_cast<const int*>(p.state);
  const unsigned* c = reinterpret_cast<const unsigned*>(p.counters) + counter * COUNTER_STRIDE;
  unsigned want = static_cast<unsigned>(need) + (break_counter == counter ? 1u : 0u);
  unsigned v = ld_acquire_gpu(c);
  if (v >= want) return true;
  const long long t0 = global_timer_ns();
  // A short cap keeps a hand-off's polling delay well under one L2 round trip.
  constexpr unsigned SLEEP_MAX_NS = 64;
  unsigned sleep_ns = 8;
  for (;;) {
    __nanosleep(sleep_ns);
    sleep_ns = sleep_ns < SLEEP_MAX_NS ? sleep_ns * 2 : SLEEP_MAX_NS;
    v = ld_acquire_gpu(c);
    if (v >= want) return true;
    if (ld_volatile(state + STATE_ABORT)) return false;
    if (global_timer_ns() - t0 > p.timeout_ns) {
      sched_report_timeout(p, ticket, counter, v, want);
      return false;
    }
  }
}

// A ticket taken from HEAD with the ABORT and BREAK words read beside its atomic, so the three
// share one round trip.
struct SchedTake {
  int ticket;
  int aborted;
  int break_counter;
};

// Thread 0 only: take the next ticket.
__device__ __forceinline__ SchedTake sched_take(const Params& p) {
  int* state = reinterpret_cast<int*>(p.state);
  SchedTake take;
  take.ticket = atomicAdd(state + STATE_HEAD, 1);
  take.aborted = ld_volatile(state + STATE_ABORT);
  take.break_counter = ld_volatile(state + STATE_BREAK);
  return take;
}

// Thread 0 only: read the taken ticket's record (ticket-ordered: one load, no ticket -> task
// indirection), wait for its counters.  Fills the slot (ticket -1: leave).
__device__ __forceinline__ void sched_fetch(const Params& p, const SchedTake& take, SchedSlot& slot) {
  slot.ticket = -1;
  const int ticket = take.ticket;
  const int break_counter = take.break_counter;
  if (take.aborted || ticket >= p.num_tasks) return;
#ifdef MW_TRACE
  const long long t_fetch = global_timer_ns();
#endif
  const int* rec = reinterpret_cast<const int*>(p.ticket_records) + static_cast<long long>(ticket) * REC_FIELDS;
#pragma unroll
  for (int i = 0; i < REC_FIELDS; ++i) slot.rec[i] = rec[i];
  // The acquire loads of the waits, then the block's barrier after the fetch, make the parents'
  // data visible to the whole block (CUTLASS's GenericBarrier pattern): no fence of its own.
  if (!sched_wait(p, ticket, slot.rec[REC_WAIT_A], slot.rec[REC_NEED_A], break_counter)) return;
  if (!sched_wait(p, ticket, slot.rec[REC_WAIT_B], slot.rec[REC_NEED_B], break_counter)) return;
#ifdef MW_TRACE
  long long* tr = reinterpret_cast<long long*>(p.trace) + static_cast<long long>(ticket) * TRACE_FIELDS;
  tr[TRACE_SM] = sm_id();
  tr[TRACE_FETCH] = t_fetch;
  tr[TRACE_START] = global_timer_ns();
#endif
  slot.ticket = ticket;
}

// Thread 0 only, after the block's barrier at the end of the task: publish.  The release is
// cumulative over the barrier, so it publishes every thread's writes without a fence of its own.
__device__ __forceinline__ void sched_signal(const Params& p, const SchedSlot& slot) {
  const int counter = slot.rec[REC_SIGNAL];
  if (counter >= 0)
    red_release_gpu_add(reinterpret_cast<unsigned*>(p.counters) + counter * COUNTER_STRIDE, 1u);
#ifdef MW_TRACE
  reinterpret_cast<long long*>(p.trace)[static_cast<long long>(slot.ticket) * TRACE_FIELDS + TRACE_END] =
      global_timer_ns();
#endif
}

// Whole block, once, after the loop.  The last block to leave resets the state and writes the
// launch's status into ``report`` (pinned host memory the host polls, or null): a launch that
// fired writes the whole line, FIRED last after a system fence, so the host never reads a
// half-written line; one that did not writes FIRED alone.
static_assert(STATUS_FLAG == 0 && STATUS_FIRED == STATUS_NEED + 1, "FIRED closes the status line");
__device__ __forceinline__ void sched_exit(const Params& p, int* s_last, int* report) {
  int* state = reinterpret_cast<int*>(p.state);
  if (threadIdx.x == 0) {
    // The adds on EXIT form one release sequence: the last block's acquire sees every block's
    // counter operations (each ordered before its add by the loop's last barrier).
    *s_last = atom_acq_rel_gpu_add(state + STATE_EXIT, 1) == static_cast<int>(gridDim.x) - 1;
  }
  __syncthreads();
  if (!*s_last) return;
  unsigned* counters = reinterpret_cast<unsigned*>(p.counters);
  for (long long i = threadIdx.x; i < p.num_counters; i += blockDim.x)
    counters[i * COUNTER_STRIDE] = 0u;
  if (threadIdx.x == 0) {
    // Every other block has left, so plain loads and stores serve; a launch that did not fire
    // writes FIRED alone (its other words are read only when FIRED grows) and needs no fence.
    int* status = state + STATE_STATUS;
    const int fired_now = ld_volatile(status + STATUS_FLAG);
    const int fired_total = ld_volatile(status + STATUS_FIRED) + fired_now;
    if (fired_now != 0) {
      status[STATUS_FLAG] = 0;
      status[STATUS_FIRED] = fired_total;
    }
    if (report != nullptr) {
      volatile int* out = report;
      if (fired_now != 0) {
        out[STATUS_FLAG] = fired_now;
        for (int i = STATUS_FLAG + 1; i < STATUS_FIRED; ++i) out[i] = ld_volatile(status + i);
        __threadfence_system();
      }
      out[STATUS_FIRED] = fired_total;
    }
    state[STATE_HEAD] = 0;
    state[STATE_ABORT] = 0;
    state[STATE_BREAK] = -1;
    state[STATE_EXIT] = 0;
  }
}

}  // namespace mw

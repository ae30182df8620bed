// Runtime parameters of one layer plan: one struct in device memory, read by
// every kernel (megakernel and non-fused).  Every field is a 64-bit integer
// (pointers included) so the host side (megawino/runtime.py) can fill it as an
// int64 array: runtime.py reads the field order from the `long long NAME;`
// lines below, so this struct is the single definition of the layout.
#pragma once

namespace mw {

struct Params {
  // device buffers (addresses)
  long long U;            // float [alpha2][c_stride][k_stride]
  long long V;            // float [alpha2][tiles_padded][c_stride]
  long long Mbuf;         // float [alpha2][tiles_padded][k_stride]
  long long records;      // int32 [num_tasks][REC_FIELDS]
  long long mapping;      // int32 [num_tasks]: ticket -> task id
  long long counters;     // uint32 [num_counters * COUNTER_STRIDE]
  long long state;        // int32 [STATE_WORDS] (scheduler.cuh)
  long long trace;        // int64 [num_tasks][4] or 0
  // layer
  long long N;
  long long C;
  long long K;
  long long H;
  long long W;
  long long pad;
  long long out_h;
  long long out_w;
  // layout / task sizes (megawino.tasks.Layout, TaskParams)
  long long tiles_h;
  long long tiles_w;
  long long tiles;
  long long tiles_per_group;
  long long tiles_padded;
  long long c_stride;
  long long k_stride;
  long long input_channels_per_task;
  long long gemm_k_per_task;
  long long k_blocks;
  long long output_k_per_task;
  long long filter_pairs_per_task;
  long long num_tasks;
  long long num_counters;
  long long timeout_ns;
};

}  // namespace mw

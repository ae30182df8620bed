// The runtime parameter struct mw::Params is generated from megawino/abi.py into
// generated_tasks.cuh (with the scheduler's state layout): one definition, shared
// with the host, which fills it as an int64 array.
#pragma once

#include "generated_tasks.cuh"

// The host's C++ shims, compiled as one translation unit: each file alone parsed ATen's (or
// TorchScript's) headers again, which was most of its compile time (11 files, about 70 s of CPU
// on a clean build, against about 15 s for this one). Each file keeps its helpers in a
// namespace of its own; the C functions keep their names.
//
// libtorch is built with NDEBUG, and `observe.cpp` needs its headers' inline code to agree
// (see there); defined here for every file, as the first file includes ATen.
#ifndef NDEBUG
#define NDEBUG
#endif

#include "amp.cpp"
#include "autocast.cpp"
#include "checkpoint.cpp"
#include "context.cpp"
#include "grad.cpp"
#include "observe.cpp"
#include "oom.cpp"
#include "optim.cpp"
#include "rng.cpp"
#include "script_module.cpp"
#include "stream.cpp"

// PYCOMM_MULTIVERSION compiles a hot function twice, for x86-64-v3 (AVX2, FMA, F16C) and for the
// baseline, and picks one at load time by the CPU it runs on. The loops it calls are inlined into
// each clone, so they are vectorized for AVX2 where the CPU has it, and a portable build still runs
// on any x86-64 (and elsewhere, where the macro is empty). Floating-point contraction is off for
// the whole core (-ffp-contract=off), so both clones give identical bits.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define PYCOMM_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PYCOMM_MULTIVERSION
#endif

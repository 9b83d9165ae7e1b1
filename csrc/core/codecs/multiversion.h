// PYCOMM_MULTIVERSION compiles a hot function twice, for x86-64-v3 (AVX2, FMA, F16C) and for the
// baseline, and picks one at load time by the CPU it runs on. The loops it calls are inlined into
// each clone, so they are vectorized for AVX2 where the CPU has it, and a portable build still runs
// on any x86-64 (and elsewhere, where the macro is empty). Floating-point contraction is off for
// the whole core (-ffp-contract=off), so both clones give identical bits.
//
// GCC inlines by its own heuristics, which leave a loop behind a switch (one per dtype) as a call
// to a baseline function: the clone then runs it with SSE. The loops and dispatchers a clone calls
// are therefore marked PYCOMM_LOOP, which forces them inline (tests/test_multiversion.py checks the
// built clones call none).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define PYCOMM_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PYCOMM_MULTIVERSION
#endif

#if defined(__GNUC__)
#define PYCOMM_LOOP [[gnu::always_inline]] inline
#else
#define PYCOMM_LOOP inline
#endif

/*
 * The emulated binaries' own AddressSanitizer/LeakSanitizer defaults, so that a user's run needs no
 * ASAN_OPTIONS (docs/emulated-gpu.md). Open MPI leaves hundreds of small allocations (its components,
 * PMIx, libevent) to the process exit, and LeakSanitizer would turn every multi-rank run's exit status
 * into 1. The suppressions below name those libraries only, so a leak in llm8's own code is still
 * reported. Two settings make that matching work:
 *   - fast_unwind_on_malloc=0: the libraries are built without frame pointers, so the fast unwinder
 *     stops after one frame (often inside libc's vasprintf) and the stack never reaches them;
 *   - Open MPI's mca_base_component_disable_dlclose: a component unloaded at MPI_Finalize would show
 *     as "<unknown module>" when the leak check runs at exit, and no suppression could name it.
 * A variable the user sets (ASAN_OPTIONS, LSAN_OPTIONS, the OMPI_MCA_ one) still wins: the sanitizer
 * parses these defaults first, and setenv below does not overwrite.
 * API: compiler-rt's sanitizer/common_interface_defs.h (the weak __asan_default_options,
 * __lsan_default_options and __lsan_default_suppressions hooks), Open MPI's MCA parameter of the same name.
 */
#include <cstdlib>

#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }

/* No "Suppressions used" table after every run: the suppressed leaks are Open MPI's, expected. */
extern "C" const char* __lsan_default_options() { return "print_suppressions=0"; }

extern "C" const char* __lsan_default_suppressions() {
    return "leak:libmpi.so\n"
           "leak:libopen-pal.so\n"
           "leak:libopen-rte.so\n"
           "leak:libpmix.so\n"
           "leak:libevent\n"
           "leak:libhwloc.so\n"
           "leak:/openmpi/lib/openmpi3/mca_\n";
}

/* Runs before main, so before MPI_Init reads its OMPI_MCA_ variables. */
__attribute__((constructor)) static void keep_mpi_components_loaded() {
    setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 0);
}
#endif

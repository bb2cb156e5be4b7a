/*
 * The emulated GPU's counts per NVTX range (docs/emulated-gpu.md). The program names the phases of its run
 * with NVTX ranges (nvtxRangePushA / nvtxRangePop: the trainer's backend_range_push, which Nsight Systems
 * shows on a GPU); here NVTX's static injection (nvtx3/nvtxDetail/nvtxInit.h: a strong
 * InitializeInjectionNvtx2_fnptr replaces the header's weak one) receives them, and the runtime counts,
 * in the innermost open range, what a step must not do (emu_count): allocate or free device or pinned
 * memory, synchronize the whole device, load a kernel (its first launch or cudaFuncGetAttributes: what
 * CUDA's lazy loading does on a GPU). With LLM8_EMU_COUNTS=1 every range's counts are printed to stderr
 * at exit, one line per range (work outside any range counts under "(no range)"):
 *   emu counts: pid 1234: range "step loop": cudaMalloc 0, cudaFree 0, ...
 * LLM8_EMU_FORBID="<range>=<event>,<event>,..." stops the program at the first of those events inside
 * that range (innermost), naming it, with the call's stack under ASan.
 */
#define NVTX_NO_IMPL /* a tool: the types, not the implementation the program carries */
#include <nvtx3/nvToolsExt.h>

#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "emu_runtime.h"

namespace {

const char* const NO_RANGE = "(no range)";

struct Counts {
    std::map<std::string, long> by_event;
};

std::mutex g_lock;
std::vector<std::string> g_ranges;            /* open ranges, innermost last */
std::map<std::string, Counts>* g_counts;      /* by range; never freed: read by the exit report */
std::vector<std::string>* g_order;            /* ranges in order of first use */

Counts& current() {
    if (!g_counts) {
        g_counts = new std::map<std::string, Counts>;
        g_order = new std::vector<std::string>;
    }
    const std::string& name = g_ranges.empty() ? std::string(NO_RANGE) : g_ranges.back();
    if (!g_counts->count(name)) g_order->push_back(name);
    return (*g_counts)[name];
}

int range_push(const char* name) {
    std::lock_guard<std::mutex> guard(g_lock);
    g_ranges.push_back(name ? name : "");
    current(); /* the range is reported even when nothing happens in it */
    return (int)g_ranges.size() - 1;
}

int range_pop() {
    std::lock_guard<std::mutex> guard(g_lock);
    if (g_ranges.empty()) emu_fail("nvtxRangePop without an open range");
    g_ranges.pop_back();
    return (int)g_ranges.size();
}

int init_injection(NvtxGetExportTableFunc_t get_table) {
    auto callbacks = static_cast<const NvtxExportTableCallbacks*>(get_table(NVTX_ETID_CALLBACKS));
    NvtxFunctionTable table = nullptr;
    unsigned int size = 0;
    if (!callbacks || !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size)) return 0;
    if (size <= NVTX_CBID_CORE_RangePop) return 0;
    *table[NVTX_CBID_CORE_RangePushA] = reinterpret_cast<NvtxFunctionPointer>(&range_push);
    *table[NVTX_CBID_CORE_RangePop] = reinterpret_cast<NvtxFunctionPointer>(&range_pop);
    return 1;
}

/* The events every range reports, zero or not, in this order; others follow when they occur. */
const char* const REPORTED[] = {"cudaMalloc", "cudaFree", "cudaMallocHost", "cudaFreeHost", "cudaDeviceSynchronize",
                                "kernel loads"};

struct Report {
    ~Report() {
        const char* on = getenv("LLM8_EMU_COUNTS");
        if (!on || strcmp(on, "1") != 0 || !g_counts) return;
        std::lock_guard<std::mutex> guard(g_lock);
        for (const std::string& range : *g_order) {
            std::map<std::string, long> events = (*g_counts)[range].by_event;
            std::string line;
            for (const char* name : REPORTED) {
                line += (line.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(events[name]);
                events.erase(name);
            }
            for (const auto& e : events) line += ", " + e.first + " " + std::to_string(e.second);
            fprintf(stderr, "emu counts: pid %d: range \"%s\": %s\n", (int)getpid(), range.c_str(), line.c_str());
        }
        fflush(stderr);
    }
} g_report;

/* LLM8_EMU_FORBID, parsed once: the range and its forbidden events. */
struct Forbidden {
    std::string range;
    std::set<std::string> events;
    Forbidden() {
        const char* v = getenv("LLM8_EMU_FORBID");
        const char* eq = v ? strchr(v, '=') : nullptr;
        if (!eq) return;
        range.assign(v, eq - v);
        for (const char* p = eq + 1; *p;) {
            const char* end = strchr(p, ',');
            events.insert(end ? std::string(p, end - p) : std::string(p));
            p = end ? end + 1 : p + strlen(p);
        }
    }
};

}  // namespace

void emu_count(const char* event) {
    static const Forbidden forbidden;
    std::lock_guard<std::mutex> guard(g_lock);
    current().by_event[event]++;
    if (!g_ranges.empty() && g_ranges.back() == forbidden.range && forbidden.events.count(event)) {
#if defined(__SANITIZE_ADDRESS__)
        __sanitizer_print_stack_trace();
#endif
        emu_fail("%s inside NVTX range \"%s\" (LLM8_EMU_FORBID)", event, forbidden.range.c_str());
    }
}

extern "C" {
extern NvtxInitializeInjectionNvtxFunc_t InitializeInjectionNvtx2_fnptr;
NvtxInitializeInjectionNvtxFunc_t InitializeInjectionNvtx2_fnptr = &init_injection;
}

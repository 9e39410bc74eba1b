// A fake `libcuda.so.1`: the subset of the CUDA driver API that cudarc 0.19 calls for pipecut,
// checked the way a driver checks it, with kernels run on the CPU (kernels.cpp).
//
// What it enforces, each a bug a real GPU would show as a failure or as garbage:
// - a context current on the calling thread for every call that works in one, and the stream,
//   module, function and event of a call all in that context;
// - kernel pointer arguments and copy ranges inside live allocations of the context's device;
//   freed memory is poisoned (NaN bytes) and kept out of reuse for a while;
// - launch limits (block and grid sizes, shared memory, registers per block from a CUBIN);
// - barriers reached by every thread of a block, at the same `__syncthreads()`; dynamic shared
//   memory used only up to the launch's size;
// - the PTX ISA version against the emulated driver version, a CUBIN's architecture against the
//   device's.
// A kernel fault gives the context the sticky error CUDA_ERROR_ILLEGAL_ADDRESS, as on a GPU.
//
// Work runs when it is issued (streams are in order, so results are the same).
//
// Environment: PC_FAKE_CUDA_DRIVER (driver version, default 12080 = CUDA 12.8; 12020 = R535),
// PC_FAKE_CUDA_DEVICES (count, default 1), PC_FAKE_CUDA_ARCH (compute capability as 80 or 90,
// default 90), PC_FAKE_CUDA_MEMORY_MB (per device, default 16384), PC_FAKE_CUDA_FAULT_AT_LAUNCH
// (make launch N fault), PC_FAKE_CUDA_BUSY_DEVICE (a device whose context cannot be made).

#include <ucontext.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include "device.h"
#include "fake.h"

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define PC_FAST_SWITCH 1
#endif

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace {

// CUresult values (cuda.h).
enum Result : int {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    DEVICE_UNAVAILABLE = 46,
    NO_DEVICE = 100,
    INVALID_DEVICE = 101,
    INVALID_IMAGE = 200,
    INVALID_CONTEXT = 201,
    NO_BINARY_FOR_GPU = 209,
    INVALID_PTX = 218,
    UNSUPPORTED_PTX_VERSION = 222,
    INVALID_HANDLE = 400,
    NOT_FOUND = 500,
    NOT_READY = 600,
    ILLEGAL_ADDRESS = 700,
    LAUNCH_OUT_OF_RESOURCES = 701,
    LAUNCH_FAILED = 719,
};

void say(const char* format, ...) {
    va_list args;
    va_start(args, format);
    std::fprintf(stderr, "fake libcuda: ");
    std::vfprintf(stderr, format, args);
    std::fprintf(stderr, "\n");
    va_end(args);
}

int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::atoi(v) : fallback;
}

struct Context;

struct Device {
    int ordinal;
    int arch;  // compute capability, major * 10 + minor
    size_t memory;
    size_t used = 0;
    std::unique_ptr<Context> primary;
    int retains = 0;
    // The default memory pool: what it keeps between synchronisations (its release threshold).
    struct Pool {
        uint64_t release_threshold = 0;
    } pool;
};

struct Context {
    Device* device;
    int sticky = SUCCESS;
};

// Stream order, checked: each stream counts its operations (`clock`) and knows how far it has
// waited for every other stream (`seen`, through events); an allocation remembers the last
// operation of each stream that touched it. An access or a free on one stream of memory that
// another stream touched later than the first has waited for (or the host has synchronised
// with) is a race on a GPU, where streams run concurrently; here it is an error.
using Clocks = std::map<uint64_t, uint64_t>;  // stream id -> operation count

struct Stream {
    Context* context;
    uint64_t id = 0;  // 0: the legacy default stream, not checked
    uint64_t clock = 0;
    Clocks seen;
    bool downloaded = false;  // a device-to-host copy was queued on it
};

struct Event {
    Context* context;
    Clocks snapshot;  // what the recording stream had done and seen
    bool timed = false;  // created without CU_EVENT_DISABLE_TIMING
    bool recorded = false;
    // When it was recorded: work runs at its launch here, so host time stands for device time.
    std::chrono::steady_clock::time_point at;
};

struct Function;

struct Module {
    Context* context;
    std::map<std::string, std::unique_ptr<Function>> functions;
};

struct Function {
    Module* module;
    const fake::Kernel* kernel;
    bool barriers;          // the binary declares barriers (PTX bar.sync, CUBIN barrier count)
    int registers;          // per thread, from a CUBIN (0 for PTX: the JIT decides)
    std::vector<size_t> ptx_params;  // parameter sizes declared by PTX (empty for a CUBIN)
};

struct Allocation {
    size_t bytes;
    Device* device;
    Clocks uses;  // the last operation of each stream on it
};

void write_stats();

struct Driver {
    std::recursive_mutex lock;
    bool initialised = false;
    int version = env_int("PC_FAKE_CUDA_DRIVER", 12080);
    // A device whose context cannot be made (busy in exclusive-process mode); -1 for none.
    int busy_device = env_int("PC_FAKE_CUDA_BUSY_DEVICE", -1);
    // A launch to fault on purpose (1-based; 0 for none), to test what follows a device fault.
    int fault_at_launch = env_int("PC_FAKE_CUDA_FAULT_AT_LAUNCH", 0);
    int launches = 0;
    std::vector<std::unique_ptr<Device>> devices;
    std::set<Stream*> streams;
    std::set<Event*> events;
    std::map<const char*, size_t> page_locked;  // cuMemHostAlloc's blocks by start
    // Copies whose host side lies in a page-locked block.
    unsigned long long page_locked_copies = 0;
    // Launches on a stream after a device-to-host copy on that stream: a stage that brought
    // outputs back on its own stream between micro-batches, waiting for the device.
    unsigned long long launches_after_download = 0;
    std::set<Module*> modules;
    std::map<uint64_t, Allocation> live;  // by start address
    std::deque<std::pair<void*, size_t>> quarantine;
    size_t quarantined = 0;
    uint64_t next_stream = 1;
    Clocks completed;  // per stream, the operations the host has synchronised with
    // Copies by direction, written to PC_FAKE_CUDA_STATS at exit for the tests.
    unsigned long long host_to_device = 0, device_to_host = 0, device_to_device = 0, peer = 0;
    // Bytes of those copies between host and device (what a micro-batch uploads).
    unsigned long long host_to_device_bytes = 0, device_to_host_bytes = 0;
    // Launches by kernel name, written there too (which path a host-side choice took).
    std::map<std::string, unsigned long long> launches_of;

    Driver() {
        int count = env_int("PC_FAKE_CUDA_DEVICES", 1);
        int arch = env_int("PC_FAKE_CUDA_ARCH", 90);
        size_t memory = size_t(env_int("PC_FAKE_CUDA_MEMORY_MB", 16384)) << 20;
        for (int i = 0; i < count; ++i) {
            devices.push_back(std::make_unique<Device>(Device{i, arch, memory}));
        }
        std::atexit(write_stats);
    }
};

Driver& driver() {
    static Driver* d = new Driver();  // never destroyed: other libraries' destructors call in
    return *d;
}

thread_local Context* current = nullptr;

using Guard = std::lock_guard<std::recursive_mutex>;

// The context every call working in one needs, with its sticky error.
int need_context() {
    if (!driver().initialised) return NOT_INITIALIZED;
    if (!current) return INVALID_CONTEXT;
    return current->sticky;
}

int need_stream(void* s, Stream** out) {
    if (int r = need_context()) return r;
    // The null stream is the current context's legacy default stream.
    if (!s) {
        static thread_local Stream legacy{nullptr};
        legacy.context = current;
        *out = &legacy;
        return SUCCESS;
    }
    auto* stream = static_cast<Stream*>(s);
    if (!driver().streams.count(stream)) return INVALID_HANDLE;
    if (stream->context != current) {
        say("a stream of device %d used while device %d's context is current",
            stream->context->device->ordinal, current->device->ordinal);
        return INVALID_CONTEXT;
    }
    *out = stream;
    return SUCCESS;
}

void fault(Context* context, const std::string& why) {
    say("%s (the context takes CUDA_ERROR_ILLEGAL_ADDRESS)", why.c_str());
    context->sticky = ILLEGAL_ADDRESS;
}

// The live allocation holding [ptr, ptr + bytes) on `device`, or null.
Allocation* find_range(Device* device, uint64_t ptr, size_t bytes) {
    auto& live = driver().live;
    auto it = live.upper_bound(ptr);
    if (it == live.begin()) return nullptr;
    --it;
    if (ptr + bytes > it->first + it->second.bytes || ptr + bytes < ptr) return nullptr;
    if (it->second.device != device) return nullptr;
    return &it->second;
}

uint64_t get(const Clocks& clocks, uint64_t id) {
    auto it = clocks.find(id);
    return it == clocks.end() ? 0 : it->second;
}

void merge(Clocks& into, const Clocks& from) {
    for (auto [id, c] : from) into[id] = std::max(into[id], c);
}

// Why stream `s` may not `what` allocation `a` yet (empty when it may), and the use recorded.
std::string order(Stream* s, Allocation* a, const char* what) {
    if (!s || s->id == 0) return "";
    for (auto [other, c] : a->uses) {
        if (other == s->id) continue;
        if (get(s->seen, other) < c && get(driver().completed, other) < c) {
            return std::string(what) + " on stream " + std::to_string(s->id) +
                   " of memory that stream " + std::to_string(other) +
                   " used without an event or a synchronisation ordering them";
        }
    }
    a->uses[s->id] = ++s->clock;
    return "";
}

// Marks everything stream `s` has done as complete, as the host has waited for it.
void synchronised(Stream* s) {
    if (s && s->id) driver().completed[s->id] = std::max(get(driver().completed, s->id), s->clock);
}

// `order` for a copy's device operand at `ptr` on `device` (already checked to be live).
int order_copy(Stream* s, Device* device, uint64_t ptr, size_t bytes, const char* what) {
    if (bytes == 0) return SUCCESS;
    std::string why = order(s, find_range(device, ptr, bytes), what);
    if (why.empty()) return SUCCESS;
    say("%s", why.c_str());
    return INVALID_VALUE;
}

void write_stats() {
    const char* path = std::getenv("PC_FAKE_CUDA_STATS");
    if (!path) return;
    Driver& d = driver();
    std::string pools;
    for (const auto& device : d.devices) {
        if (!pools.empty()) pools += ", ";
        pools += std::to_string(device->pool.release_threshold);
    }
    std::string launches;
    for (const auto& [name, count] : d.launches_of) {
        if (!launches.empty()) launches += ", ";
        launches += "\"" + name + "\": " + std::to_string(count);
    }
    if (FILE* f = std::fopen(path, "w")) {
        std::fprintf(f,
                     "{\"host_to_device\": %llu, \"device_to_host\": %llu, "
                     "\"host_to_device_bytes\": %llu, \"device_to_host_bytes\": %llu, "
                     "\"device_to_device\": %llu, \"peer\": %llu, \"page_locked\": %llu, "
                     "\"launches_after_download\": %llu, "
                     "\"pool_release_threshold\": [%s], \"launches\": {%s}}\n",
                     d.host_to_device, d.device_to_host, d.host_to_device_bytes,
                     d.device_to_host_bytes, d.device_to_device, d.peer,
                     d.page_locked_copies, d.launches_after_download,
                     pools.c_str(), launches.c_str());
        std::fclose(f);
    }
}

std::string describe(uint64_t ptr) {
    char text[160];
    auto& live = driver().live;
    auto it = live.upper_bound(ptr);
    if (it != live.begin()) {
        --it;
        if (ptr < it->first + it->second.bytes) {
            std::snprintf(text, sizeof text, "0x%llx (offset %llu of a %zu-byte allocation on device %d)",
                          (unsigned long long)ptr, (unsigned long long)(ptr - it->first),
                          it->second.bytes, it->second.device->ordinal);
            return text;
        }
    }
    std::snprintf(text, sizeof text, "0x%llx (in no live allocation)", (unsigned long long)ptr);
    return text;
}

// ---- Images: PTX text or a CUBIN (ELF). ----

// Highest PTX ISA version (major * 10 + minor) a driver of CUDA version `v` JIT-compiles.
int max_ptx_isa(int v) {
    static const int table[][2] = {{12000, 80}, {12010, 81}, {12020, 82}, {12030, 83},
                                   {12040, 84}, {12050, 85}, {12060, 85}, {12080, 87},
                                   {12090, 88}, {13000, 90}};
    int isa = 78;
    for (auto& row : table) {
        if (v >= row[0]) isa = row[1];
    }
    return isa;
}

struct Entry {
    std::string name;
    bool barriers = false;
    int registers = 0;
    std::vector<size_t> params;
};

int parse_ptx(const std::string& ptx, int arch, std::vector<Entry>* entries) {
    size_t at = ptx.find(".version ");
    size_t target = ptx.find(".target sm_");
    if (at == std::string::npos || target == std::string::npos) return INVALID_PTX;
    int major = 0, minor = 0, sm = 0;
    std::sscanf(ptx.c_str() + at, ".version %d.%d", &major, &minor);
    std::sscanf(ptx.c_str() + target, ".target sm_%d", &sm);
    int isa = major * 10 + minor;
    if (isa > max_ptx_isa(driver().version)) {
        say("PTX ISA %d.%d is newer than driver %d.%d accepts (up to ISA %d.%d)", major, minor,
            driver().version / 1000, driver().version % 1000 / 10,
            max_ptx_isa(driver().version) / 10, max_ptx_isa(driver().version) % 10);
        return UNSUPPORTED_PTX_VERSION;
    }
    if (sm > arch) {
        say("PTX for sm_%d cannot be compiled for the device's sm_%d", sm, arch);
        return INVALID_PTX;
    }
    size_t pos = 0;
    const std::string marker = ".entry ";
    while ((pos = ptx.find(marker, pos)) != std::string::npos) {
        Entry e;
        size_t name_end = ptx.find('(', pos);
        e.name = ptx.substr(pos + marker.size(), name_end - pos - marker.size());
        size_t params_end = ptx.find(')', name_end);
        std::string params = ptx.substr(name_end, params_end - name_end);
        size_t p = 0;
        while ((p = params.find(".param", p)) != std::string::npos) {
            size_t line_end = params.find_first_of(",\n)", p);
            std::string decl = params.substr(p, line_end - p);
            size_t bracket = decl.find('[');
            if (bracket != std::string::npos) {
                e.params.push_back(std::strtoul(decl.c_str() + bracket + 1, nullptr, 10));
            } else {
                // `.param .u64 name`: the type's width in bits follows its letter.
                unsigned bits = 0;
                std::sscanf(decl.c_str(), ".param .%*c%u", &bits);
                e.params.push_back(bits / 8);
            }
            p = line_end;
        }
        size_t next = ptx.find(marker, params_end);
        std::string body = ptx.substr(params_end, next == std::string::npos ? std::string::npos
                                                                             : next - params_end);
        e.barriers = body.find("bar.sync") != std::string::npos ||
                     body.find("barrier.sync") != std::string::npos ||
                     body.find("call") != std::string::npos;
        entries->push_back(e);
        pos = params_end;
    }
    return SUCCESS;
}

template <typename T>
T read_at(const unsigned char* image, size_t offset) {
    T v;
    std::memcpy(&v, image + offset, sizeof v);
    return v;
}

// A CUBIN: ELF64, machine EM_CUDA (190), the architecture in the low byte of e_flags; kernels
// are the global function symbols, and each `.text.<kernel>` section carries its register
// count (sh_info >> 24) and barrier count ((sh_flags >> 20) & 0x7f).
int parse_cubin(const unsigned char* image, int arch, std::vector<Entry>* entries) {
    if (image[4] != 2 || read_at<uint16_t>(image, 0x12) != 190) return INVALID_IMAGE;
    int cubin_arch = read_at<uint32_t>(image, 0x30) & 0xff;
    if (cubin_arch / 10 != arch / 10 || cubin_arch > arch) {
        say("a CUBIN for sm_%d cannot run on the device's sm_%d", cubin_arch, arch);
        return NO_BINARY_FOR_GPU;
    }
    uint64_t shoff = read_at<uint64_t>(image, 0x28);
    uint16_t shentsize = read_at<uint16_t>(image, 0x3a);
    uint16_t shnum = read_at<uint16_t>(image, 0x3c);
    uint16_t shstrndx = read_at<uint16_t>(image, 0x3e);
    auto section = [&](int i) { return image + shoff + size_t(i) * shentsize; };
    uint64_t names = read_at<uint64_t>(section(shstrndx), 0x18);
    for (int i = 0; i < shnum; ++i) {
        const unsigned char* s = section(i);
        std::string name = reinterpret_cast<const char*>(image + names + read_at<uint32_t>(s, 0));
        if (name.rfind(".text.", 0) != 0) continue;
        Entry e;
        e.name = name.substr(6);
        e.barriers = ((read_at<uint64_t>(s, 0x08) >> 20) & 0x7f) != 0;
        e.registers = int(read_at<uint32_t>(s, 0x2c) >> 24);
        entries->push_back(e);
    }
    return SUCCESS;
}

// ---- Running a grid: a fiber per CUDA thread where the kernel has barriers. ----

struct Fiber {
    std::vector<char> stack;
    bool done = false;
    int barrier_line = 0;  // the __syncthreads() it waits at (0 when running)
#ifdef PC_FAST_SWITCH
    void* sp = nullptr;
#else
    ucontext_t context;
#endif
};

constexpr size_t kStack = 256 * 1024;

struct BlockRun {
    std::vector<Fiber> fibers;
    Fiber* running = nullptr;
    const fake::Kernel* kernel = nullptr;
    void** params = nullptr;
    bool fibers_on = false;
    bool undeclared_barrier = false;
#ifdef PC_FAST_SWITCH
    void* scheduler_sp = nullptr;
#else
    ucontext_t scheduler;
#endif
};

thread_local BlockRun block_run;

void fiber_main();

#ifdef PC_FAST_SWITCH
// swapcontext saves the signal mask with a system call on every switch, which made barriers
// most of a run's time; this switch saves only the callee-saved registers and the stack.
extern "C" void pc_fake_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .globl pc_fake_switch
    .type pc_fake_switch, @function
pc_fake_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size pc_fake_switch, .-pc_fake_switch
)");

void start_fiber(Fiber& f) {
    // The stack as pc_fake_switch leaves it: six saved registers, then the address `ret`
    // jumps to, then a slot for fiber_main's own (never used) return address.
    auto top = reinterpret_cast<uintptr_t>(f.stack.data() + f.stack.size()) & ~uintptr_t(15);
    auto* sp = reinterpret_cast<void**>(top - 8);
    *sp = nullptr;
    *--sp = reinterpret_cast<void*>(&fiber_main);
    for (int i = 0; i < 6; ++i) *--sp = nullptr;
    f.sp = sp;
}
void resume(Fiber& f) { pc_fake_switch(&block_run.scheduler_sp, f.sp); }
void yield(Fiber& f) { pc_fake_switch(&f.sp, block_run.scheduler_sp); }
#else
void start_fiber(Fiber& f) {
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.data();
    f.context.uc_stack.ss_size = f.stack.size();
    f.context.uc_link = nullptr;
    makecontext(&f.context, fiber_main, 0);
}
void resume(Fiber& f) {
#ifdef __SANITIZE_ADDRESS__
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, f.stack.data(), f.stack.size());
    swapcontext(&block_run.scheduler, &f.context);
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
    swapcontext(&block_run.scheduler, &f.context);
#endif
}
void yield(Fiber& f) {
#ifdef __SANITIZE_ADDRESS__
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, nullptr, 0);
    swapcontext(&f.context, &block_run.scheduler);
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
    swapcontext(&f.context, &block_run.scheduler);
#endif
}
#endif

void fiber_main() {
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    BlockRun& b = block_run;
    b.kernel->run(b.params);
    b.running->done = true;
    yield(*b.running);  // never resumed
    std::abort();
}

}  // namespace

extern "C" void pc_fake_syncthreads(int line) {
    BlockRun& b = block_run;
    if (!b.fibers_on) {
        // The binary declared no barrier, so the threads are not fibers: the real compiler and
        // this copy of the source disagree.
        b.undeclared_barrier = true;
        return;
    }
    b.running->barrier_line = line;
    yield(*b.running);
}

namespace {

// Runs one block; returns an error text, empty when it ran cleanly.
std::string run_block(const fake::Kernel* kernel, void** params, bool barriers) {
    BlockRun& b = block_run;
    b.kernel = kernel;
    b.params = params;
    b.fibers_on = barriers;
    unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    auto set_thread = [&](unsigned t) {
        threadIdx = uint3{t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y)};
    };
    if (!barriers) {
        for (unsigned t = 0; t < threads; ++t) {
            set_thread(t);
            kernel->run(params);
        }
        return b.undeclared_barrier ? "a kernel without declared barriers called __syncthreads()" : "";
    }
    if (b.fibers.size() < threads) b.fibers.resize(threads);
    for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = b.fibers[t];
        if (f.stack.empty()) f.stack.resize(kStack);
        f.done = false;
        f.barrier_line = 0;
        start_fiber(f);
    }
    for (;;) {
        unsigned finished = 0, waiting = 0;
        int line = 0;
        bool same_line = true;
        for (unsigned t = 0; t < threads; ++t) {
            Fiber& f = b.fibers[t];
            if (f.done) continue;
            f.barrier_line = 0;
            set_thread(t);
            b.running = &f;
            resume(f);
        }
        for (unsigned t = 0; t < threads; ++t) {
            Fiber& f = b.fibers[t];
            if (f.done) {
                ++finished;
            } else {
                ++waiting;
                if (line == 0) line = f.barrier_line;
                same_line = same_line && f.barrier_line == line;
            }
        }
        if (waiting == 0) return "";
        if (finished > 0) {
            return std::to_string(waiting) + " of " + std::to_string(threads) +
                   " threads wait at the __syncthreads() of line " + std::to_string(line) +
                   " that the others never reach";
        }
        if (!same_line) return "threads of one block wait at different __syncthreads() calls";
    }
}

constexpr unsigned char kPoison = 0xff;  // every float made of these bytes is a NaN

// Every allocation is followed by a red zone of poison that a kernel must leave alone: checked
// after each launch for the buffers it was given (under ASan, poisoned for real instead).
constexpr size_t kRedzone = 4096;

size_t redzone_end(size_t bytes) { return (bytes + 255) / 256 * 256 + kRedzone; }

// An error text when a write went past the allocation holding `ptr`.
std::string check_redzone(uint64_t ptr) {
#ifdef __SANITIZE_ADDRESS__
    (void)ptr;
    return "";
#else
    auto& live = driver().live;
    auto it = live.upper_bound(ptr);
    if (it == live.begin()) return "";
    --it;
    const auto* base = reinterpret_cast<const unsigned char*>(it->first);
    for (size_t i = it->second.bytes; i < redzone_end(it->second.bytes); ++i) {
        if (base[i] != kPoison) {
            return "wrote into the red zone " + std::to_string(i - it->second.bytes) + " bytes past the end of " +
                   describe(it->first);
        }
    }
    return "";
#endif
}

int launch(Function* f, Stream* launch_stream, dim3 grid, dim3 block, unsigned shared,
           void** params) {
    const fake::Kernel* k = f->kernel;
    Context* context = f->module->context;
    unsigned long long threads = 1ull * block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        block.x > 1024 || block.y > 1024 || block.z > 64 || threads > 1024 ||
        grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        say("%s: launch of grid (%u, %u, %u) x block (%u, %u, %u) is outside the limits", k->name,
            grid.x, grid.y, grid.z, block.x, block.y, block.z);
        return INVALID_VALUE;
    }
    if (shared > fake::kSharedLimit) {
        say("%s: %u bytes of dynamic shared memory, above 48 KiB", k->name, shared);
        return INVALID_VALUE;
    }
    if (f->registers * threads > 65536) {
        say("%s: %d registers x %llu threads exceed the 65536 registers of a block", k->name,
            f->registers, threads);
        return LAUNCH_OUT_OF_RESOURCES;
    }
    if (!params) return INVALID_VALUE;
    if (!f->ptx_params.empty()) {
        bool same = f->ptx_params.size() == k->args.size();
        for (size_t i = 0; same && i < k->args.size(); ++i) same = f->ptx_params[i] == k->args[i].size;
        if (!same) {
            say("%s: the PTX's parameters differ from the C++ build of the same source", k->name);
            return INVALID_IMAGE;
        }
    }
    for (size_t i = 0; i < k->args.size(); ++i) {
        if (!k->args[i].pointer) continue;
        uint64_t ptr;
        std::memcpy(&ptr, params[i], sizeof ptr);
        Allocation* a = find_range(context->device, ptr, 1);
        if (!a) {
            fault(context, std::string(k->name) + ": pointer argument " + std::to_string(i) + " is " +
                               describe(ptr) + ", not memory of device " +
                               std::to_string(context->device->ordinal));
            return SUCCESS;  // reported by the next call, as a GPU does
        }
        std::string why = order(launch_stream, a, k->name);
        if (!why.empty()) {
            fault(context, why);
            return SUCCESS;
        }
    }
    gridDim = grid;
    blockDim = block;
    block_run.undeclared_barrier = false;
    const auto& arrays = fake::shared_arrays();
    for (unsigned z = 0; z < grid.z; ++z) {
        for (unsigned y = 0; y < grid.y; ++y) {
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = uint3{x, y, z};
                for (const auto& a : arrays) {
                    std::memset(a.storage(), kPoison, shared + fake::kSharedGuard);
#ifdef __SANITIZE_ADDRESS__
                    ASAN_UNPOISON_MEMORY_REGION(a.storage(), fake::kSharedLimit + fake::kSharedGuard);
                    ASAN_POISON_MEMORY_REGION(a.storage() + shared,
                                              fake::kSharedLimit + fake::kSharedGuard - shared);
#endif
                }
                std::string error = run_block(k, params, f->barriers);
                for (const auto& a : arrays) {
#ifdef __SANITIZE_ADDRESS__
                    ASAN_UNPOISON_MEMORY_REGION(a.storage(), fake::kSharedLimit + fake::kSharedGuard);
#endif
                    const unsigned char* guard = a.storage() + shared;
                    for (size_t i = 0; error.empty() && i < fake::kSharedGuard; ++i) {
                        if (guard[i] != kPoison) {
                            error = "wrote past its " + std::to_string(shared) +
                                    " bytes of dynamic shared memory ('" + a.name + "')";
                        }
                    }
                }
                if (!error.empty()) {
                    fault(context, std::string(k->name) + ": block (" + std::to_string(x) + ", " +
                                       std::to_string(y) + ", " + std::to_string(z) + ") " + error);
                    return SUCCESS;
                }
            }
        }
    }
    for (size_t i = 0; i < k->args.size(); ++i) {
        if (!k->args[i].pointer) continue;
        uint64_t ptr;
        std::memcpy(&ptr, params[i], sizeof ptr);
        std::string error = check_redzone(ptr);
        if (!error.empty()) {
            fault(context, std::string(k->name) + ": argument " + std::to_string(i) + ": " + error);
            return SUCCESS;
        }
    }
    return SUCCESS;
}

void release(uint64_t ptr, Allocation a) {
    Driver& d = driver();
    a.device->used -= a.bytes;
    std::memset(reinterpret_cast<void*>(ptr), kPoison, a.bytes);
#ifdef __SANITIZE_ADDRESS__
    ASAN_POISON_MEMORY_REGION(reinterpret_cast<void*>(ptr), a.bytes);
#endif
    // Freed memory stays poisoned and unused until 1 GiB more has been freed, so a kernel
    // reading a freed buffer reads NaNs rather than someone else's data.
    d.quarantine.emplace_back(reinterpret_cast<void*>(ptr), redzone_end(a.bytes));
    d.quarantined += redzone_end(a.bytes);
    while (d.quarantined > (size_t(1) << 30)) {
        auto [p, n] = d.quarantine.front();
        d.quarantine.pop_front();
        d.quarantined -= n;
#ifdef __SANITIZE_ADDRESS__
        ASAN_UNPOISON_MEMORY_REGION(p, n);
#endif
        std::free(p);
    }
}

int copy_check(uint64_t device_ptr, size_t bytes, const char* what) {
    if (bytes == 0) return SUCCESS;
    if (!find_range(current->device, device_ptr, bytes)) {
        say("%s of %zu bytes at %s is outside every live allocation of device %d", what, bytes,
            describe(device_ptr).c_str(), current->device->ordinal);
        return INVALID_VALUE;
    }
    return SUCCESS;
}

}  // namespace

// ---- The driver API (C linkage, the signatures of cuda.h). ----

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;

extern "C" {

CUresult cuInit(unsigned flags) {
    Guard g(driver().lock);
    if (flags != 0) return INVALID_VALUE;
    driver().initialised = true;
    return SUCCESS;
}

CUresult cuDriverGetVersion(int* version) {
    if (!version) return INVALID_VALUE;
    *version = driver().version;
    return SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
    Guard g(driver().lock);
    if (!driver().initialised) return NOT_INITIALIZED;
    *count = int(driver().devices.size());
    return SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    Guard g(driver().lock);
    if (!driver().initialised) return NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= int(driver().devices.size())) return INVALID_DEVICE;
    *device = ordinal;
    return SUCCESS;
}

CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
    if (device < 0 || device >= int(driver().devices.size())) return INVALID_DEVICE;
    std::snprintf(name, size_t(length), "pipecut fake sm_%d", driver().devices[device]->arch);
    return SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
    if (device < 0 || device >= int(driver().devices.size())) return INVALID_DEVICE;
    *bytes = driver().devices[device]->memory;
    return SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
    Guard g(driver().lock);
    if (!driver().initialised) return NOT_INITIALIZED;
    if (device < 0 || device >= int(driver().devices.size())) return INVALID_DEVICE;
    int arch = driver().devices[device]->arch;
    switch (attribute) {
        case 1: *value = 1024; break;             // MAX_THREADS_PER_BLOCK
        case 2: case 3: *value = 1024; break;     // MAX_BLOCK_DIM_X, _Y
        case 4: *value = 64; break;               // MAX_BLOCK_DIM_Z
        case 5: *value = 2147483647; break;       // MAX_GRID_DIM_X
        case 6: case 7: *value = 65535; break;    // MAX_GRID_DIM_Y, _Z
        case 8: *value = 48 * 1024; break;        // MAX_SHARED_MEMORY_PER_BLOCK
        case 10: *value = 32; break;              // WARP_SIZE
        case 12: *value = 65536; break;           // MAX_REGISTERS_PER_BLOCK
        case 16: *value = 4; break;               // MULTIPROCESSOR_COUNT
        case 75: *value = arch / 10; break;       // COMPUTE_CAPABILITY_MAJOR
        case 76: *value = arch % 10; break;       // COMPUTE_CAPABILITY_MINOR
        case 115: *value = 1; break;              // MEMORY_POOLS_SUPPORTED
        default: *value = 0; break;
    }
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(void** context, CUdevice device) {
    Guard g(driver().lock);
    if (!driver().initialised) return NOT_INITIALIZED;
    if (device < 0 || device >= int(driver().devices.size())) return INVALID_DEVICE;
    if (device == driver().busy_device) return DEVICE_UNAVAILABLE;
    Device* d = driver().devices[device].get();
    if (!d->primary) d->primary = std::make_unique<Context>(Context{d});
    ++d->retains;
    *context = d->primary.get();
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    Guard g(driver().lock);
    if (device < 0 || device >= int(driver().devices.size())) return INVALID_DEVICE;
    Device* d = driver().devices[device].get();
    if (d->retains == 0) return INVALID_CONTEXT;
    // The context object stays (released contexts may still be named by stale handles).
    --d->retains;
    return SUCCESS;
}

CUresult cuCtxGetCurrent(void** context) {
    Guard g(driver().lock);
    if (!driver().initialised) return NOT_INITIALIZED;
    *context = current;
    return SUCCESS;
}

CUresult cuCtxSetCurrent(void* context) {
    Guard g(driver().lock);
    if (!driver().initialised) return NOT_INITIALIZED;
    auto* c = static_cast<Context*>(context);
    if (c && c->device->retains == 0) return INVALID_CONTEXT;
    current = c;
    return SUCCESS;
}

CUresult cuCtxSynchronize() {
    Guard g(driver().lock);
    return need_context();
}

CUresult cuStreamCreate(void** stream, unsigned flags) {
    Guard g(driver().lock);
    if (int r = need_context()) return r;
    (void)flags;
    auto* s = new Stream{current, driver().next_stream++};
    driver().streams.insert(s);
    *stream = s;
    return SUCCESS;
}

CUresult cuStreamDestroy_v2(void* stream) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    if (!stream) return INVALID_HANDLE;
    synchronised(s);  // its work finishes before its resources go
    driver().streams.erase(s);
    delete s;
    return SUCCESS;
}

CUresult cuStreamSynchronize(void* stream) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    synchronised(s);
    return SUCCESS;
}

// A host function queued on a stream. Work runs when it is queued here, so the function runs
// now; a driver runs it on a thread of its own once the stream reaches it. Either way it must
// make no CUDA call.
CUresult cuLaunchHostFunc(void* stream, void (*fn)(void*), void* data) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    if (!fn) return INVALID_VALUE;
    fn(data);
    return SUCCESS;
}

CUresult cuStreamWaitEvent(void* stream, void* event, unsigned flags) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    (void)flags;
    auto* e = static_cast<Event*>(event);
    if (!driver().events.count(e)) return INVALID_HANDLE;
    merge(s->seen, e->snapshot);
    return SUCCESS;
}

CUresult cuEventCreate(void** event, unsigned flags) {
    Guard g(driver().lock);
    if (int r = need_context()) return r;
    auto* e = new Event{current};
    e->timed = !(flags & 0x2);  // CU_EVENT_DISABLE_TIMING
    driver().events.insert(e);
    *event = e;
    return SUCCESS;
}

CUresult cuEventRecord(void* event, void* stream) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    auto* e = static_cast<Event*>(event);
    if (!driver().events.count(e)) return INVALID_HANDLE;
    if (e->context != s->context) return INVALID_CONTEXT;
    e->snapshot = s->seen;
    if (s->id) e->snapshot[s->id] = s->clock;
    e->recorded = true;
    e->at = std::chrono::steady_clock::now();
    return SUCCESS;
}

// Whether [host, host + bytes) lies in one page-locked block.
static bool is_page_locked(const void* host, size_t bytes) {
    const char* p = static_cast<const char*>(host);
    auto& blocks = driver().page_locked;
    auto it = blocks.upper_bound(p);
    if (it == blocks.begin()) return false;
    --it;
    return p + bytes <= it->first + it->second;
}

// As the driver: both events recorded, in one context, neither without timing.
CUresult cuEventElapsedTime(float* ms, void* start, void* end) {
    Guard g(driver().lock);
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    if (!driver().events.count(a) || !driver().events.count(b)) return INVALID_HANDLE;
    if (a->context != b->context) return INVALID_CONTEXT;
    if (!a->timed || !b->timed) return INVALID_HANDLE;
    if (!a->recorded || !b->recorded) return NOT_READY;
    *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
    return SUCCESS;
}

// Page-locked host memory is plain host memory here; freeing a pointer it did not give fails
// as the driver's does.
CUresult cuMemHostAlloc(void** ptr, size_t bytes, unsigned flags) {
    Guard g(driver().lock);
    if (int r = need_context()) return r;
    (void)flags;
    if (bytes == 0) return INVALID_VALUE;
    void* block = std::malloc(bytes);
    if (!block) return OUT_OF_MEMORY;
    driver().page_locked[static_cast<const char*>(block)] = bytes;
    *ptr = block;
    return SUCCESS;
}

CUresult cuMemFreeHost(void* ptr) {
    Guard g(driver().lock);
    if (!driver().page_locked.erase(static_cast<const char*>(ptr))) return INVALID_VALUE;
    std::free(ptr);
    return SUCCESS;
}

CUresult cuEventSynchronize(void* event) {
    Guard g(driver().lock);
    auto* e = static_cast<Event*>(event);
    if (!driver().events.count(e)) return INVALID_HANDLE;
    merge(driver().completed, e->snapshot);
    return e->context->sticky;
}

CUresult cuEventQuery(void* event) { return cuEventSynchronize(event); }

CUresult cuEventDestroy_v2(void* event) {
    Guard g(driver().lock);
    auto* e = static_cast<Event*>(event);
    if (!driver().events.erase(e)) return INVALID_HANDLE;
    delete e;
    return SUCCESS;
}

CUresult cuMemAllocAsync(CUdeviceptr* ptr, size_t bytes, void* stream) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    if (bytes == 0) return INVALID_VALUE;
    Device* d = current->device;
    if (d->used + bytes > d->memory) return OUT_OF_MEMORY;
    size_t span = redzone_end(bytes);
    void* p = std::aligned_alloc(256, span);
    if (!p) return OUT_OF_MEMORY;
    std::memset(p, kPoison, span);  // device memory starts as garbage, here NaNs
#ifdef __SANITIZE_ADDRESS__
    ASAN_POISON_MEMORY_REGION(static_cast<char*>(p) + bytes, span - bytes);
#endif
    d->used += bytes;
    *ptr = reinterpret_cast<uint64_t>(p);
    driver().live[*ptr] = Allocation{bytes, d};
    return SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr* ptr, size_t bytes) {
    Guard g(driver().lock);
    return cuMemAllocAsync(ptr, bytes, nullptr);
}

CUresult cuMemFreeAsync(CUdeviceptr ptr, void* stream) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    auto it = driver().live.find(ptr);
    if (it == driver().live.end()) {
        say("free of %s", describe(ptr).c_str());
        return INVALID_VALUE;
    }
    if (it->second.device != current->device) {
        say("free of device %d memory in device %d's context", it->second.device->ordinal,
            current->device->ordinal);
        return INVALID_VALUE;
    }
    std::string why = order(s, &it->second, "free");
    if (!why.empty()) {
        say("%s", why.c_str());
        return INVALID_VALUE;
    }
    Allocation a = it->second;
    driver().live.erase(it);
    release(ptr, a);
    return SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) { return cuMemFreeAsync(ptr, nullptr); }

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, void* stream) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    if (int r = copy_check(dst, bytes, "host-to-device copy")) return r;
    if (int r = order_copy(s, current->device, dst, bytes, "host-to-device copy")) return r;
    ++driver().host_to_device;
    driver().host_to_device_bytes += bytes;
    if (is_page_locked(src, bytes)) ++driver().page_locked_copies;
    std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
    return SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
    return cuMemcpyHtoDAsync_v2(dst, src, bytes, nullptr);
}

CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, void* stream) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    if (int r = copy_check(src, bytes, "device-to-host copy")) return r;
    if (int r = order_copy(s, current->device, src, bytes, "device-to-host copy")) return r;
    ++driver().device_to_host;
    driver().device_to_host_bytes += bytes;
    if (s) s->downloaded = true;
    if (is_page_locked(dst, bytes)) ++driver().page_locked_copies;
    std::memcpy(dst, reinterpret_cast<void*>(src), bytes);
    return SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
    return cuMemcpyDtoHAsync_v2(dst, src, bytes, nullptr);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, void* stream) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    if (int r = copy_check(src, bytes, "device-to-device copy source")) return r;
    if (int r = copy_check(dst, bytes, "device-to-device copy destination")) return r;
    if (int r = order_copy(s, current->device, src, bytes, "device-to-device copy")) return r;
    if (int r = order_copy(s, current->device, dst, bytes, "device-to-device copy")) return r;
    ++driver().device_to_device;
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), bytes);
    return SUCCESS;
}

CUresult cuDeviceGetDefaultMemPool(void** pool, CUdevice device) {
    Guard g(driver().lock);
    if (!driver().initialised) return NOT_INITIALIZED;
    if (device < 0 || device >= int(driver().devices.size())) return INVALID_DEVICE;
    *pool = &driver().devices[device]->pool;
    return SUCCESS;
}

// Only the release threshold (attribute 4), a u64 no larger than the device's memory.
CUresult cuMemPoolSetAttribute(void* pool, int attribute, void* value) {
    Guard g(driver().lock);
    for (const auto& device : driver().devices) {
        if (pool != &device->pool) continue;
        if (attribute != 4) return INVALID_VALUE;
        uint64_t bytes;
        std::memcpy(&bytes, value, sizeof bytes);
        if (bytes > device->memory) {
            say("a release threshold of %llu bytes for device %d, which has %zu",
                (unsigned long long)bytes, device->ordinal, device->memory);
            return INVALID_VALUE;
        }
        device->pool.release_threshold = bytes;
        return SUCCESS;
    }
    return INVALID_HANDLE;
}

// A copy between two devices' memory, on a stream of the current context.
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, void* dst_context, CUdeviceptr src, void* src_context,
                           size_t bytes, void* stream) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    auto* to = static_cast<Context*>(dst_context);
    auto* from = static_cast<Context*>(src_context);
    if (!to || !from) return INVALID_CONTEXT;
    if (bytes == 0) return SUCCESS;
    if (!find_range(from->device, src, bytes) || !find_range(to->device, dst, bytes)) {
        say("peer copy of %zu bytes from %s (device %d) to %s (device %d) is outside the live "
            "allocations",
            bytes, describe(src).c_str(), from->device->ordinal, describe(dst).c_str(),
            to->device->ordinal);
        return INVALID_VALUE;
    }
    if (int r = order_copy(s, from->device, src, bytes, "peer copy")) return r;
    if (int r = order_copy(s, to->device, dst, bytes, "peer copy")) return r;
    ++driver().peer;
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), bytes);
    return SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes, void* stream) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    if (int r = copy_check(dst, bytes, "memset")) return r;
    if (int r = order_copy(s, current->device, dst, bytes, "memset")) return r;
    std::memset(reinterpret_cast<void*>(dst), value, bytes);
    return SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
    Guard g(driver().lock);
    if (int r = need_context()) return r;
    *total = current->device->memory;
    *free = current->device->memory - current->device->used;
    return SUCCESS;
}

CUresult cuModuleLoadData(void** module, const void* image) {
    Guard g(driver().lock);
    if (int r = need_context()) return r;
    if (!image) return INVALID_VALUE;
    const auto* bytes = static_cast<const unsigned char*>(image);
    std::vector<Entry> entries;
    int arch = current->device->arch;
    int r = std::memcmp(bytes, "\x7f" "ELF", 4) == 0
                ? parse_cubin(bytes, arch, &entries)
                : parse_ptx(reinterpret_cast<const char*>(image), arch, &entries);
    if (r) return r;
    auto* m = new Module{current, {}};
    for (const Entry& e : entries) {
        const fake::Kernel* k = fake::find_kernel(e.name);
        if (!k) {
            say("the image has kernel '%s', which the fake's build of kernels.cu lacks", e.name.c_str());
            delete m;
            return INVALID_IMAGE;
        }
        m->functions[e.name] =
            std::make_unique<Function>(Function{m, k, e.barriers, e.registers, e.params});
    }
    driver().modules.insert(m);
    *module = m;
    return SUCCESS;
}

CUresult cuModuleUnload(void* module) {
    Guard g(driver().lock);
    auto* m = static_cast<Module*>(module);
    if (!driver().modules.erase(m)) return INVALID_HANDLE;
    delete m;
    return SUCCESS;
}

CUresult cuModuleGetFunction(void** function, void* module, const char* name) {
    Guard g(driver().lock);
    if (int r = need_context()) return r;
    auto* m = static_cast<Module*>(module);
    if (!driver().modules.count(m)) return INVALID_HANDLE;
    if (m->context != current) return INVALID_CONTEXT;
    auto it = m->functions.find(name);
    if (it == m->functions.end()) return NOT_FOUND;
    *function = it->second.get();
    return SUCCESS;
}

CUresult cuLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, void* stream, void** params,
                        void** extra) {
    Guard g(driver().lock);
    Stream* s;
    if (int r = need_stream(stream, &s)) return r;
    auto* f = static_cast<Function*>(function);
    bool known = false;
    for (Module* m : driver().modules) known = known || (m == f->module);
    if (!known) return INVALID_HANDLE;
    if (f->module->context != current) {
        say("%s: a function of device %d launched in device %d's context", f->kernel->name,
            f->module->context->device->ordinal, current->device->ordinal);
        return INVALID_CONTEXT;
    }
    if (extra) return INVALID_VALUE;
    ++driver().launches_of[f->kernel->name];
    if (s && s->downloaded) ++driver().launches_after_download;
    if (++driver().launches == driver().fault_at_launch) {
        fault(current, std::string(f->kernel->name) + ": fault injected at launch " +
                           std::to_string(driver().launches) + " (PC_FAKE_CUDA_FAULT_AT_LAUNCH)");
        return SUCCESS;
    }
    return launch(f, s, dim3{gx, gy, gz}, dim3{bx, by, bz}, shared, params);
}

CUresult cuGetErrorName(int error, const char** text) {
    static std::map<int, std::string> names = {
        {0, "CUDA_SUCCESS"}, {1, "CUDA_ERROR_INVALID_VALUE"}, {2, "CUDA_ERROR_OUT_OF_MEMORY"},
        {3, "CUDA_ERROR_NOT_INITIALIZED"}, {46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
        {100, "CUDA_ERROR_NO_DEVICE"},
        {101, "CUDA_ERROR_INVALID_DEVICE"}, {200, "CUDA_ERROR_INVALID_IMAGE"},
        {201, "CUDA_ERROR_INVALID_CONTEXT"}, {209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
        {218, "CUDA_ERROR_INVALID_PTX"}, {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
        {400, "CUDA_ERROR_INVALID_HANDLE"}, {500, "CUDA_ERROR_NOT_FOUND"},
        {700, "CUDA_ERROR_ILLEGAL_ADDRESS"}, {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
        {719, "CUDA_ERROR_LAUNCH_FAILED"}};
    auto it = names.find(error);
    if (it == names.end()) return INVALID_VALUE;
    *text = it->second.c_str();
    return SUCCESS;
}

CUresult cuGetErrorString(int error, const char** text) {
    static std::map<int, std::string> texts = {
        {0, "no error"}, {1, "invalid argument"}, {2, "out of memory"},
        {3, "initialization error"},
        {46, "CUDA-capable device(s) is/are busy or unavailable"},
        {100, "no CUDA-capable device is detected"},
        {101, "invalid device ordinal"}, {200, "device kernel image is invalid"},
        {201, "invalid device context"}, {209, "no kernel image is available for execution on the device"},
        {218, "a PTX JIT compilation failed"},
        {222, "the provided PTX was compiled with an unsupported toolchain."},
        {400, "invalid resource handle"}, {500, "named symbol not found"},
        {700, "an illegal memory access was encountered"},
        {701, "too many resources requested for launch"}, {719, "unspecified launch failure"}};
    auto it = texts.find(error);
    if (it == texts.end()) return INVALID_VALUE;
    *text = it->second.c_str();
    return SUCCESS;
}

// ---- For the fake cuBLAS. ----

void* pc_fake_current_context() { return current; }

void* pc_fake_stream_context(void* stream) {
    Guard g(driver().lock);
    if (!stream) return current;
    auto* s = static_cast<Stream*>(stream);
    return driver().streams.count(s) ? s->context : nullptr;
}

void pc_fake_count_call(const char* name) {
    Guard g(driver().lock);
    ++driver().launches_of[name];
}

int pc_fake_context_error(void* context) {
    Guard g(driver().lock);
    return context ? static_cast<Context*>(context)->sticky : SUCCESS;
}

bool pc_fake_check_range(void* context, void* stream, uint64_t ptr, size_t bytes,
                         const char* what) {
    Guard g(driver().lock);
    auto* c = static_cast<Context*>(context);
    if (Allocation* a = find_range(c->device, ptr, bytes)) {
        auto* s = static_cast<Stream*>(stream);
        std::string why = driver().streams.count(s) ? order(s, a, what) : "";
        if (why.empty()) return true;
        fault(c, "cuBLAS: " + why);
        return false;
    }
    fault(c, std::string("cuBLAS: ") + what + " of " + std::to_string(bytes) + " bytes at " +
                 describe(ptr) + " is outside every live allocation of device " +
                 std::to_string(c->device->ordinal));
    return false;
}

}  // extern "C"

// The project's kernels.cu compiled as C++ (see device.h), and the table the driver launches
// them from. The kernel list and the shared arrays are read from kernels.cu by the test harness
// (tests/common/fake_cuda.rs) into registry.inc, so nothing here names a kernel.

#include <type_traits>
#include <utility>

#include "device.h"
#include "fake.h"

#include PC_KERNEL_SOURCE

namespace {

template <typename F>
struct Signature;

template <typename... A>
struct Signature<void (*)(A...)> {
    template <auto F, size_t... I>
    static void call(void** params, std::index_sequence<I...>) {
        F(*static_cast<std::decay_t<A>*>(params[I])...);
    }
    template <auto F>
    static void run(void** params) {
        call<F>(params, std::index_sequence_for<A...>{});
    }
    static std::vector<fake::Arg> args() {
        return {fake::Arg{sizeof(std::decay_t<A>), std::is_pointer_v<std::decay_t<A>>}...};
    }
};

}  // namespace

#define PC_SHARED(type, name)                                                          \
    alignas(16) __thread type name[(fake::kSharedLimit + fake::kSharedGuard) / sizeof(type)]; \
    static unsigned char* storage_##name() { return reinterpret_cast<unsigned char*>(name); }
#define PC_KERNEL(name)
#include "registry.inc"
#undef PC_SHARED
#undef PC_KERNEL

namespace fake {

const std::vector<SharedArray>& shared_arrays() {
#define PC_SHARED(type, name) SharedArray{#name, &storage_##name},
#define PC_KERNEL(name)
    static const std::vector<SharedArray> arrays = {
#include "registry.inc"
    };
#undef PC_SHARED
#undef PC_KERNEL
    return arrays;
}

const Kernel* find_kernel(const std::string& name) {
#define PC_SHARED(type, name)
#define PC_KERNEL(name)                                                                    \
    Kernel{#name, &Signature<decltype(&name)>::run<&name>, Signature<decltype(&name)>::args()},
    static const std::vector<Kernel> kernels = {
#include "registry.inc"
    };
#undef PC_SHARED
#undef PC_KERNEL
    for (const Kernel& k : kernels) {
        if (name == k.name) return &k;
    }
    return nullptr;
}

}  // namespace fake

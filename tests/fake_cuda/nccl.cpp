// A fake `libnccl.so.2`: the NCCL calls pipecut's NCCL transport makes, working across
// processes. The fake driver's device memory is host memory, so a transfer is a copy through a
// Unix socket: the unique id names a fresh directory, every rank of a communicator listens on
// `rank-R.sock` in it, and `ncclSend` writes the buffer's bytes into the receiver's socket,
// which `ncclRecv` reads into its own buffer.
//
// It checks what NCCL and a GPU would enforce: a communicator belongs to the context current
// when it was made; a call's stream must belong to that context and the context must be current;
// every buffer must lie inside a live allocation of that device; a receive must be posted for
// exactly the bytes sent, with the same datatype; ranks and counts are in range. A peer that
// exits is `ncclRemoteError`, kept as the communicator's asynchronous error as NCCL keeps it.
//
// Work runs when it is called on a blocking communicator (the fake driver runs streams
// synchronously too); on a non-blocking one it runs on a thread of the communicator and the
// call answers ncclInProgress until ncclCommGetAsyncError sees it done. The unique id's
// directory is made under PC_FAKE_NCCL_DIR, else TMPDIR, else /tmp, and left there (it holds
// each rank's mark that it joined). A non-blocking
// communicator (`config.blocking = 0`) answers `ncclInProgress` from its initialisation and its
// sends and receives, so the caller's polling of `ncclCommGetAsyncError` is exercised.

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fake.h"

namespace {

enum Result : int {
    SUCCESS = 0,
    UNHANDLED_CUDA_ERROR = 1,
    SYSTEM_ERROR = 2,
    INTERNAL_ERROR = 3,
    INVALID_ARGUMENT = 4,
    INVALID_USAGE = 5,
    REMOTE_ERROR = 6,
    IN_PROGRESS = 7,
};

constexpr const char* kIdMagic = "pc-fake-nccl:";
// NCCL_VERSION(2, 23, 4).
constexpr int kVersion = 22304;
constexpr unsigned kConfigMagic = 0xcafebeef;

// The prefix of ncclConfig_t every NCCL version shares.
struct ConfigPrefix {
    size_t size;
    unsigned magic;
    unsigned version;
    int blocking;
};

struct Comm {
    std::string dir;
    int rank = 0;
    int nranks = 0;
    void* context = nullptr;
    int listener = -1;
    std::map<int, int> to;    // peer -> socket this rank writes to
    std::map<int, int> from;  // peer -> socket this rank reads from
    std::atomic<int> async{SUCCESS};  // the asynchronous error ncclCommGetAsyncError reports
    bool in_progress = false;
    bool blocking = true;
    std::string last_error;
    // A non-blocking communicator's operation runs on `worker`; `busy` until it is done (its
    // writes to `async` and `last_error` are then visible). `aborting` asks it to give up.
    std::thread worker;
    std::atomic<bool> busy{false};
    std::atomic<bool> aborting{false};
};

struct Op {
    bool send;
    const void* send_buf;
    void* recv_buf;
    size_t count;
    int datatype;
    int peer;
    Comm* comm;
    void* stream;
};

std::recursive_mutex lock;
std::set<Comm*> comms;
thread_local int group_depth = 0;
thread_local std::vector<Op> grouped;
thread_local std::string thread_error;

void say(const char* format, ...) {
    char text[1024];
    va_list args;
    va_start(args, format);
    std::vsnprintf(text, sizeof text, format, args);
    va_end(args);
    std::fprintf(stderr, "fake libnccl: %s\n", text);
    thread_error = text;
}

int fail(Comm* c, int result, const char* format, ...) {
    char text[1024];
    va_list args;
    va_start(args, format);
    std::vsnprintf(text, sizeof text, format, args);
    va_end(args);
    std::fprintf(stderr, "fake libnccl: rank %d: %s\n", c ? c->rank : -1, text);
    if (c) {
        c->last_error = text;
        if (result == REMOTE_ERROR || result == SYSTEM_ERROR) c->async = result;
    }
    thread_error = text;
    return result;
}

size_t type_size(int datatype) {
    switch (datatype) {
        case 0: case 1: return 1;           // int8, uint8
        case 2: case 3: case 7: return 4;   // int32, uint32, float32
        case 4: case 5: case 8: return 8;   // int64, uint64, float64
        case 6: case 9: return 2;           // float16, bfloat16
        default: return 0;
    }
}

std::string socket_path(const std::string& dir, int rank) {
    return dir + "/rank-" + std::to_string(rank) + ".sock";
}

// A rank's mark that it joined: it outlives the rank's socket, so a rank that joins late still
// sees that a quick peer joined, used and destroyed its communicator (initialisation is
// collective in NCCL).
std::string joined_path(const std::string& dir, int rank) {
    return dir + "/rank-" + std::to_string(rank) + ".joined";
}

bool fill_address(sockaddr_un* address, const std::string& path) {
    std::memset(address, 0, sizeof *address);
    address->sun_family = AF_UNIX;
    if (path.size() >= sizeof address->sun_path) return false;
    std::memcpy(address->sun_path, path.c_str(), path.size());
    return true;
}

bool write_all(int fd, const void* data, size_t bytes) {
    auto* p = static_cast<const char*>(data);
    while (bytes > 0) {
        ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        bytes -= size_t(n);
    }
    return true;
}

// False at the end of the connection or on an error.
bool read_all(int fd, void* data, size_t bytes) {
    auto* p = static_cast<char*>(data);
    while (bytes > 0) {
        ssize_t n = ::read(fd, p, bytes);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        bytes -= size_t(n);
    }
    return true;
}

int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : fallback;
}

// Every rank has joined (the communicator is complete), or the wait ran out.
bool wait_for_ranks(const Comm* c) {
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::seconds(env_int("PC_FAKE_NCCL_INIT_SECS", 60));
    for (;;) {
        bool all = true;
        for (int r = 0; r < c->nranks && all; ++r) {
            struct stat st;
            all = ::stat(joined_path(c->dir, r).c_str(), &st) == 0;
        }
        if (all) return true;
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
}

// The socket to write to `peer`, connected (and introduced) on first use.
int writer(Comm* c, int peer) {
    auto it = c->to.find(peer);
    if (it != c->to.end()) return it->second;
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address;
    if (fd < 0 || !fill_address(&address, socket_path(c->dir, peer)) ||
        ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        !write_all(fd, &c->rank, sizeof c->rank)) {
        if (fd >= 0) ::close(fd);
        return -1;
    }
    c->to[peer] = fd;
    return fd;
}

// The socket `peer` writes to this rank on, accepting connections until its arrives.
int reader(Comm* c, int peer) {
    for (;;) {
        auto it = c->from.find(peer);
        if (it != c->from.end()) return it->second;
        int fd = ::accept4(c->listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0 && errno == EINTR) continue;
        if (fd < 0) return -1;
        int who = -1;
        if (!read_all(fd, &who, sizeof who) || who < 0 || who >= c->nranks || c->from.count(who)) {
            ::close(fd);
            continue;
        }
        c->from[who] = fd;
    }
}

struct Header {
    uint64_t bytes;
    int datatype;
    int tag;
};

// Checks a call against its communicator, stream, buffer; SUCCESS when it may run.
int check_call(const char* name, const void* buf, size_t count, int datatype, int peer, Comm* c,
               void* stream) {
    if (!comms.count(c)) {
        say("%s on a communicator that does not exist (destroyed, or never made)", name);
        return INVALID_ARGUMENT;
    }
    if (c->async != SUCCESS) return c->async;
    if (c->in_progress) return fail(c, INVALID_USAGE, "%s while the communicator is still initialising", name);
    size_t size = type_size(datatype);
    if (size == 0) return fail(c, INVALID_ARGUMENT, "%s: datatype %d is not an NCCL datatype", name, datatype);
    if (peer < 0 || peer >= c->nranks || peer == c->rank)
        return fail(c, INVALID_ARGUMENT, "%s: peer %d is not another rank of %d", name, peer, c->nranks);
    if (pc_fake_current_context() != c->context)
        return fail(c, INVALID_USAGE, "%s while the communicator's context is not current", name);
    if (pc_fake_stream_context(stream) != c->context)
        return fail(c, INVALID_ARGUMENT, "%s on a stream of another context (device)", name);
    if (pc_fake_context_error(c->context)) return UNHANDLED_CUDA_ERROR;
    if (count > 0 && !pc_fake_check_range(c->context, stream, uint64_t(uintptr_t(buf)), count * size, name))
        return fail(c, INVALID_ARGUMENT, "%s: the buffer of %zu bytes is not live device memory", name,
                    count * size);
    return SUCCESS;
}

// PC_FAKE_NCCL_SILENT_RANK: this rank's sends never leave (a wedged NCCL or link), so that a
// receiver's timeout, and an abort of a communicator with work in flight, can be tested. Only
// on a non-blocking communicator, whose caller can give up.
bool silent(const Comm* c) {
    return !c->blocking && env_int("PC_FAKE_NCCL_SILENT_RANK", -1) == c->rank;
}

int run(const Op& op) {
    Comm* c = op.comm;
    size_t bytes = op.count * type_size(op.datatype);
    if (op.send && silent(c)) {
        while (!c->aborting) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return fail(c, SYSTEM_ERROR, "ncclSend to rank %d: aborted before it left", op.peer);
    }
    if (op.send) {
        int fd = writer(c, op.peer);
        Header h{bytes, op.datatype, 0};
        if (fd < 0 || !write_all(fd, &h, sizeof h) || !write_all(fd, op.send_buf, bytes))
            return fail(c, REMOTE_ERROR, "ncclSend to rank %d: the peer is gone (%s)", op.peer,
                        std::strerror(errno));
        return SUCCESS;
    }
    int fd = reader(c, op.peer);
    Header h{};
    bool came = fd >= 0 && read_all(fd, &h, sizeof h);
    if (!came && c->aborting)
        return fail(c, SYSTEM_ERROR, "ncclRecv from rank %d: aborted before it came", op.peer);
    if (!came)
        return fail(c, REMOTE_ERROR, "ncclRecv from rank %d: the peer closed its connection", op.peer);
    if (h.bytes != bytes || h.datatype != op.datatype)
        return fail(c, INVALID_USAGE,
                    "ncclRecv of %zu bytes (datatype %d) from rank %d, which sent %llu bytes (datatype %d)",
                    bytes, op.datatype, op.peer, (unsigned long long)h.bytes, h.datatype);
    if (!read_all(fd, op.recv_buf, bytes))
        return fail(c, REMOTE_ERROR, "ncclRecv from rank %d: the peer closed its connection mid-message",
                    op.peer);
    return SUCCESS;
}

// Waits for a non-blocking communicator's operation in flight.
void finish_work(Comm* c) {
    if (c->worker.joinable()) c->worker.join();
}

// Runs `op` now on a blocking communicator; on a non-blocking one, on its worker thread
// (after the operation before it), answering ncclInProgress, as NCCL does while it enqueues.
int submit(const Op& op) {
    if (group_depth > 0) {
        grouped.push_back(op);
        return SUCCESS;
    }
    Comm* c = op.comm;
    if (c->blocking) return run(op);
    finish_work(c);
    if (c->async != SUCCESS) return c->async;
    c->busy = true;
    c->worker = std::thread([c, op] {
        int result = run(op);
        if (result != SUCCESS && c->async == SUCCESS) c->async = result;
        c->busy = false;
    });
    return IN_PROGRESS;
}

// Unblocks the worker's reads, writes and accepts, so that an abort ends work in flight.
void interrupt(Comm* c) {
    c->aborting = true;
    for (auto& [peer, fd] : c->to) ::shutdown(fd, SHUT_RDWR);
    for (auto& [peer, fd] : c->from) ::shutdown(fd, SHUT_RDWR);
    if (c->listener >= 0) ::shutdown(c->listener, SHUT_RDWR);
}

void close_comm(Comm* c) {
    finish_work(c);
    for (auto& [peer, fd] : c->to) ::close(fd);
    for (auto& [peer, fd] : c->from) ::close(fd);
    if (c->listener >= 0) {
        ::close(c->listener);
        ::unlink(socket_path(c->dir, c->rank).c_str());
    }
    // The `.joined` marks stay: a peer may still be waiting to see them. The directory is made
    // under PC_FAKE_NCCL_DIR (or TMPDIR), which the tests point at a folder of their own.
    comms.erase(c);
    delete c;
}

}  // namespace

extern "C" {

struct ncclUniqueId {
    char internal[128];
};

const char* ncclGetErrorString(int result) {
    switch (result) {
        case SUCCESS: return "no error";
        case UNHANDLED_CUDA_ERROR: return "unhandled cuda error";
        case SYSTEM_ERROR: return "unhandled system error";
        case INTERNAL_ERROR: return "internal error";
        case INVALID_ARGUMENT: return "invalid argument";
        case INVALID_USAGE: return "invalid usage";
        case REMOTE_ERROR: return "remote process exited or there was a network error";
        case IN_PROGRESS: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

const char* ncclGetLastError(void* comm) {
    std::lock_guard<std::recursive_mutex> g(lock);
    auto* c = static_cast<Comm*>(comm);
    if (c && comms.count(c)) return c->last_error.c_str();
    return thread_error.c_str();
}

int ncclGetVersion(int* version) {
    if (!version) return INVALID_ARGUMENT;
    *version = kVersion;
    return SUCCESS;
}

int ncclGetUniqueId(ncclUniqueId* id) {
    if (!id) return INVALID_ARGUMENT;
    const char* base = std::getenv("PC_FAKE_NCCL_DIR");
    if (!base) base = std::getenv("TMPDIR");
    std::string pattern = std::string(base ? base : "/tmp") + "/fake-nccl-XXXXXX";
    std::vector<char> path(pattern.begin(), pattern.end());
    path.push_back('\0');
    if (!::mkdtemp(path.data())) {
        say("ncclGetUniqueId: cannot make a directory from %s: %s", pattern.c_str(), std::strerror(errno));
        return SYSTEM_ERROR;
    }
    std::string text = std::string(kIdMagic) + path.data();
    if (text.size() >= sizeof id->internal) {
        say("ncclGetUniqueId: the directory's name is too long for an id");
        return INTERNAL_ERROR;
    }
    std::memset(id->internal, 0, sizeof id->internal);
    std::memcpy(id->internal, text.c_str(), text.size());
    return SUCCESS;
}

int ncclCommInitRankConfig(void** comm, int nranks, ncclUniqueId id, int rank, void* config) {
    std::lock_guard<std::recursive_mutex> g(lock);
    if (!comm) return INVALID_ARGUMENT;
    *comm = nullptr;
    bool blocking = true;
    if (config) {
        auto* prefix = static_cast<const ConfigPrefix*>(config);
        if (prefix->magic != kConfigMagic || prefix->size < sizeof(ConfigPrefix)) {
            say("ncclCommInitRankConfig: the config was not made from NCCL_CONFIG_INITIALIZER");
            return INVALID_ARGUMENT;
        }
        blocking = prefix->blocking != 0;
    }
    std::string text(id.internal, strnlen(id.internal, sizeof id.internal));
    if (text.rfind(kIdMagic, 0) != 0) {
        say("ncclCommInitRankConfig: the unique id did not come from ncclGetUniqueId");
        return INVALID_ARGUMENT;
    }
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        say("ncclCommInitRankConfig: rank %d of %d", rank, nranks);
        return INVALID_ARGUMENT;
    }
    void* context = pc_fake_current_context();
    if (!context) {
        say("ncclCommInitRankConfig with no current CUDA context");
        return UNHANDLED_CUDA_ERROR;
    }
    auto* c = new Comm;
    c->dir = text.substr(std::strlen(kIdMagic));
    c->rank = rank;
    c->nranks = nranks;
    c->context = context;
    c->blocking = blocking;
    sockaddr_un address;
    c->listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->listener < 0 || !fill_address(&address, socket_path(c->dir, rank)) ||
        ::bind(c->listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(c->listener, 64) != 0) {
        say("ncclCommInitRankConfig: rank %d cannot listen in %s: %s", rank, c->dir.c_str(),
            std::strerror(errno));
        if (c->listener >= 0) ::close(c->listener);
        delete c;
        return SYSTEM_ERROR;
    }
    int mark = ::open(joined_path(c->dir, rank).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    if (mark < 0) {
        say("ncclCommInitRankConfig: rank %d cannot mark itself joined in %s: %s", rank,
            c->dir.c_str(), std::strerror(errno));
        ::close(c->listener);
        delete c;
        return SYSTEM_ERROR;
    }
    ::close(mark);
    comms.insert(c);
    if (!wait_for_ranks(c)) {
        fail(c, SYSTEM_ERROR, "not every one of %d ranks joined the communicator", nranks);
    }
    *comm = c;
    if (!blocking && c->async == SUCCESS) {
        c->in_progress = true;
        return IN_PROGRESS;
    }
    return c->async;
}

int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

int ncclCommGetAsyncError(void* comm, int* error) {
    std::lock_guard<std::recursive_mutex> g(lock);
    auto* c = static_cast<Comm*>(comm);
    if (!comms.count(c) || !error) return INVALID_ARGUMENT;
    if (c->in_progress) {
        // Initialisation "finishes" the first time it is polled.
        c->in_progress = false;
        *error = IN_PROGRESS;
        return SUCCESS;
    }
    *error = c->busy ? int(IN_PROGRESS) : c->async.load();
    return SUCCESS;
}

int ncclSend(const void* buf, size_t count, int datatype, int peer, void* comm, void* stream) {
    std::lock_guard<std::recursive_mutex> g(lock);
    auto* c = static_cast<Comm*>(comm);
    if (int r = check_call("ncclSend", buf, count, datatype, peer, c, stream)) return r;
    return submit(Op{true, buf, nullptr, count, datatype, peer, c, stream});
}

int ncclRecv(void* buf, size_t count, int datatype, int peer, void* comm, void* stream) {
    std::lock_guard<std::recursive_mutex> g(lock);
    auto* c = static_cast<Comm*>(comm);
    if (int r = check_call("ncclRecv", buf, count, datatype, peer, c, stream)) return r;
    return submit(Op{false, nullptr, buf, count, datatype, peer, c, stream});
}

int ncclGroupStart() {
    ++group_depth;
    return SUCCESS;
}

// A group's sends run before its receives, so a rank exchanging with a peer in one group does
// not wait for a message the peer has not been able to send yet.
int ncclGroupEnd() {
    std::lock_guard<std::recursive_mutex> g(lock);
    if (group_depth == 0) {
        say("ncclGroupEnd without ncclGroupStart");
        return INVALID_USAGE;
    }
    if (--group_depth > 0) return SUCCESS;
    std::vector<Op> ops;
    ops.swap(grouped);
    int result = SUCCESS;
    for (bool sends : {true, false})
        for (const Op& op : ops)
            if (op.send == sends && result == SUCCESS && comms.count(op.comm)) result = run(op);
    return result;
}

int ncclCommFinalize(void* comm) {
    std::lock_guard<std::recursive_mutex> g(lock);
    return comms.count(static_cast<Comm*>(comm)) ? SUCCESS : INVALID_ARGUMENT;
}

int ncclCommDestroy(void* comm) {
    std::lock_guard<std::recursive_mutex> g(lock);
    auto* c = static_cast<Comm*>(comm);
    if (!comms.count(c)) return INVALID_ARGUMENT;
    close_comm(c);
    return SUCCESS;
}

int ncclCommAbort(void* comm) {
    std::lock_guard<std::recursive_mutex> g(lock);
    auto* c = static_cast<Comm*>(comm);
    if (!comms.count(c)) return INVALID_ARGUMENT;
    interrupt(c);
    close_comm(c);
    return SUCCESS;
}

int ncclCommCount(void* comm, int* count) {
    std::lock_guard<std::recursive_mutex> g(lock);
    auto* c = static_cast<Comm*>(comm);
    if (!comms.count(c) || !count) return INVALID_ARGUMENT;
    *count = c->nranks;
    return SUCCESS;
}

int ncclCommUserRank(void* comm, int* rank) {
    std::lock_guard<std::recursive_mutex> g(lock);
    auto* c = static_cast<Comm*>(comm);
    if (!comms.count(c) || !rank) return INVALID_ARGUMENT;
    *rank = c->rank;
    return SUCCESS;
}

}  // extern "C"

// NcclCommunicator (see nccl_communicator.h): NCCL opened with dlopen, its entry points resolved
// with dlsym against our own declarations of the documented C ABI.
#include "runtime/cuda/nccl_communicator.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <type_traits>
#include <utility>

#include "kernels/cuda/common/cuda_check.h"

namespace ds::runtime {

namespace {

// ---- The NCCL C ABI (nccl.h, stable since NCCL 2.0) ----
// ncclComm_t is an opaque pointer; ncclUniqueId is 128 bytes (NCCL_UNIQUE_ID_BYTES); the enums
// are C enums (passed as int). Only the values used here are declared.
using NcclComm = void*;
using NcclResult = int;                  // ncclResult_t
constexpr NcclResult kNcclSuccess = 0;   // ncclSuccess
constexpr int kNcclFloat32 = 7;          // ncclDataType_t ncclFloat32 (= ncclFloat)
constexpr int kNcclSum = 0;              // ncclRedOp_t ncclSum
// NCCL_VERSION(2, 9, 6): collectives capturable into CUDA graphs. NCCL encodes 2.8.x and older
// as X*1000 + Y*100 + Z (2804) and newer as X*10000 + Y*100 + Z (20906), so the codes compare.
constexpr int kMinNcclVersion = 20906;

using GetVersionFn = NcclResult (*)(int* version);
using CommInitAllFn = NcclResult (*)(NcclComm* comms, int ndev, const int* devlist);
using AllReduceFn = NcclResult (*)(const void* sendbuff, void* recvbuff, size_t count,
                                   int datatype, int op, NcclComm comm, cudaStream_t stream);
using CommDestroyFn = NcclResult (*)(NcclComm comm);
using CommAbortFn = NcclResult (*)(NcclComm comm);
using GetErrorStringFn = const char* (*)(NcclResult result);
using GetLastErrorFn = const char* (*)(NcclComm comm);  // NCCL 2.13+, optional

struct NcclApi {
  void* handle = nullptr;
  GetVersionFn get_version = nullptr;
  CommInitAllFn comm_init_all = nullptr;
  AllReduceFn all_reduce = nullptr;
  CommDestroyFn comm_destroy = nullptr;
  CommAbortFn comm_abort = nullptr;
  GetErrorStringFn get_error_string = nullptr;
  GetLastErrorFn get_last_error = nullptr;
  int version = 0;
  Status status;  // ok when every required entry point resolved
};

std::string version_string(int code) {
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

Status not_usable(const std::string& library, const std::string& why) {
  return failed_precondition("NCCL not usable: " + why + " (library \"" + library +
                             "\"; install NCCL 2.9.6 or newer, e.g. the libnccl2 package or the "
                             "nvidia-nccl-cu12 wheel, or set " + kNcclLibraryEnv +
                             " to the path of libnccl.so.2)");
}

// Opens `library` and resolves the entry points. The handle is kept open on success (the cached
// API lives for the process); on failure it is closed.
NcclApi load(const std::string& library) {
  NcclApi api;
  api.handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (api.handle == nullptr) {
    const char* why = dlerror();
    api.status = not_usable(library, std::string("NCCL not found: ") +
                                         (why != nullptr ? why : "dlopen failed"));
    return api;
  }
  std::string missing;
  auto resolve = [&](auto& fn, const char* name, bool required) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api.handle, name));
    if (fn == nullptr && required) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  resolve(api.get_version, "ncclGetVersion", true);
  resolve(api.comm_init_all, "ncclCommInitAll", true);
  resolve(api.all_reduce, "ncclAllReduce", true);
  resolve(api.comm_destroy, "ncclCommDestroy", true);
  resolve(api.comm_abort, "ncclCommAbort", true);
  resolve(api.get_error_string, "ncclGetErrorString", true);
  resolve(api.get_last_error, "ncclGetLastError", false);
  if (!missing.empty()) {
    api.status = not_usable(library, "missing entry points " + missing);
  } else if (api.get_version(&api.version) != kNcclSuccess) {
    api.status = not_usable(library, "ncclGetVersion failed");
  } else if (api.version < kMinNcclVersion) {
    api.status = not_usable(library, "version " + version_string(api.version) +
                                         " is older than 2.9.6");
  }
  if (!api.status.ok()) {
    dlclose(api.handle);
    NcclApi failed;
    failed.status = api.status;
    return failed;
  }
  return api;
}

// The process's NCCL, loaded on first use (thread-safe: a function-local static).
const NcclApi& nccl() {
  static const NcclApi api = [] {
    const char* env = std::getenv(kNcclLibraryEnv);
    return load(env != nullptr && env[0] != '\0' ? env : "libnccl.so.2");
  }();
  return api;
}

// A failed NCCL call as a Status: the call, NCCL's error string and, where the library has it,
// the communicator's last detailed message.
Status nccl_check(NcclResult result, const char* what, NcclComm comm = nullptr) {
  if (result == kNcclSuccess) return ok_status();
  const NcclApi& api = nccl();
  std::string message = std::string("NCCL error in ") + what + ": " +
                        api.get_error_string(result) + " (" + std::to_string(result) + ")";
  if (api.get_last_error != nullptr) {
    const char* last = api.get_last_error(comm);
    if (last != nullptr && last[0] != '\0') message += std::string(": ") + last;
  }
  return internal_error(std::move(message));
}

}  // namespace

Status nccl_status() {
  return nccl().status;
}

std::string nccl_version_string() {
  return nccl().status.ok() ? version_string(nccl().version) : std::string();
}

Status probe_nccl_library(const std::string& library) {
  NcclApi api = load(library);
  if (api.handle != nullptr) dlclose(api.handle);
  return api.status;
}

Result<std::vector<std::unique_ptr<NcclCommunicator>>> NcclCommunicator::create_local(
    const std::vector<int>& devices) {
  const NcclApi& api = nccl();
  DS_RETURN_IF_ERROR(api.status);
  if (devices.empty()) return invalid_argument("NCCL communicator: no devices");
  int count = 0;
  DS_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  std::set<int> seen;
  for (int d : devices) {
    if (d < 0 || d >= count) {
      return invalid_argument("NCCL communicator: device " + std::to_string(d) + " of " +
                              std::to_string(count) + " visible");
    }
    if (!seen.insert(d).second) {
      return invalid_argument("NCCL communicator: device " + std::to_string(d) +
                              " given twice (one rank per GPU)");
    }
  }
  const int n = int(devices.size());
  std::vector<NcclComm> comms(devices.size(), nullptr);
  // ncclCommInitAll switches the current device while it sets up each rank: restore ours.
  int current = 0;
  DS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  const NcclResult init = api.comm_init_all(comms.data(), n, devices.data());
  DS_CUDA_RETURN_IF_ERROR(cudaSetDevice(current));
  DS_RETURN_IF_ERROR(nccl_check(init, "ncclCommInitAll"));
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  for (int r = 0; r < n; ++r) {
    out.push_back(std::unique_ptr<NcclCommunicator>(
        new NcclCommunicator(comms[size_t(r)], r, n, devices[size_t(r)])));
  }
  return out;
}

NcclCommunicator::~NcclCommunicator() {
  NcclComm comm = comm_.exchange(nullptr);
  if (comm == nullptr) return;
  // Destroy with the rank's device current (NCCL frees device memory of that device).
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) current = -1;
  (void)cudaSetDevice(device_);
  const Status st = nccl_check(nccl().comm_destroy(comm), "ncclCommDestroy", nullptr);
  if (!st.ok()) std::fprintf(stderr, "deepserve: %s\n", st.message().c_str());
  if (current >= 0) (void)cudaSetDevice(current);
}

void NcclCommunicator::abort() {
  NcclComm comm = comm_.exchange(nullptr);
  if (comm == nullptr) return;
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) current = -1;
  (void)cudaSetDevice(device_);
  const Status st = nccl_check(nccl().comm_abort(comm), "ncclCommAbort", nullptr);
  if (!st.ok()) std::fprintf(stderr, "deepserve: %s\n", st.message().c_str());
  if (current >= 0) (void)cudaSetDevice(current);
}

Status NcclCommunicator::all_reduce_sum(float* x, int64_t n, cudaStream_t stream) {
  if (n < 0) return invalid_argument("NCCL all-reduce of a negative count");
  if (n == 0) return ok_status();
  NcclComm comm = comm_.load();
  if (comm == nullptr) {
    return failed_precondition("NCCL all-reduce on an aborted communicator (rank " +
                               std::to_string(rank_) + ")");
  }
  return nccl_check(nccl().all_reduce(x, x, size_t(n), kNcclFloat32, kNcclSum, comm, stream),
                    "ncclAllReduce", comm);
}

}  // namespace ds::runtime

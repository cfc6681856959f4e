// SPDX-License-Identifier: BSD-3-Clause
// Communicator: checked MPI calls on a duplicated communicator, with traffic accounting.
#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/simulated_mpi.hpp>
#include <oktopk/impl/base/hash.hpp>
#include <oktopk/impl/comm/mpi_check.hpp>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace oktopk {

// Everything copies of a Communicator share. Freeing the duplicate here, with the last owner,
// lets copies, PhaseScopes and Requests outlive the Communicator object they came from.
struct Communicator::State {
  MPI_Comm comm = MPI_COMM_NULL;
  std::string phase = "other";
  std::map<std::string, PhaseTraffic> traffic;
  bool log_messages = false;
  std::vector<MessageRecord> message_log;
  std::atomic<std::int64_t> serials{0};

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  ~State() {
    // After MPI_Finalize no MPI call is allowed; the handle is then simply dropped. Errors are
    // ignored: a destructor must not throw.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm != MPI_COMM_NULL) {
      MPI_Comm_free(&comm);
    }
  }

  void charge(const std::string& to, const char* operation, int peer, const PhaseTraffic& t) {
    // Zero charges (every collective when P == 1) leave no empty phase behind, and no record.
    if (t == PhaseTraffic{}) {
      return;
    }
    traffic[to] += t;
    if (log_messages) {
      message_log.push_back(MessageRecord{
          to, operation, peer, t.bytes_sent, t.bytes_received, t.messages_sent, t.messages_received,
          t.bytes_sent_between_nodes, t.bytes_received_between_nodes});
    }
  }
};

namespace {

constexpr const char* kCommunicator = "oktopk::Communicator::Communicator";
constexpr const char* kSplit = "oktopk::Communicator::split";
constexpr const char* kSplitSharedMemory = "oktopk::Communicator::split_shared_memory";
constexpr const char* kIsend = "oktopk::Communicator::isend";
constexpr const char* kIrecv = "oktopk::Communicator::irecv";
constexpr const char* kWaitAll = "oktopk::Communicator::Requests::wait_all";
constexpr const char* kAllreduce = "oktopk::Communicator::allreduce";
constexpr const char* kAlltoall = "oktopk::Communicator::alltoall";
constexpr const char* kAllgather = "oktopk::Communicator::allgather";
constexpr const char* kAllgatherv = "oktopk::Communicator::allgatherv";
constexpr const char* kBcast = "oktopk::Communicator::bcast";
constexpr const char* kReduceScatter = "oktopk::Communicator::reduce_scatter";
constexpr const char* kReduceScatterBlock = "oktopk::Communicator::reduce_scatter_block";
constexpr const char* kBarrier = "oktopk::Communicator::barrier";
constexpr const char* kCheckAgreement = "oktopk::Communicator::check_agreement";

// MPI counts are int; OkTopk's are 64-bit so that sums over ranks cannot overflow.
int checked_count(const char* where, const char* what, count_type count) {
  OKTOPK_REQUIRE(count >= 0 && count <= INT_MAX, std::invalid_argument, where,
                 what << " = " << count << " is outside [0, " << INT_MAX << "]");
  return static_cast<int>(count);
}

// Checked here rather than left to MPI: an out-of-range rank is a caller's bug, and
// MPI_ERR_RANK would otherwise surface as a runtime_error.
void check_rank(const char* where, const char* what, int rank, int size) {
  OKTOPK_REQUIRE(
      rank >= 0 && rank < size, std::invalid_argument, where,
      what << " = " << rank << " is not a rank of this communicator (size " << size << ")");
}

std::int64_t type_size(const char* where, MPI_Datatype type) {
  int size = 0;
  OKTOPK_MPI_CHECK(where, MPI_Type_size(type, &size));
  return size;
}

// Bytes of block r when B bytes are split into P blocks, the first B mod P one byte larger.
std::int64_t block_bytes(std::int64_t total, int parts, int r) {
  return total / parts + (r < total % parts ? 1 : 0);
}

// MPI_ERRORS_RETURN on MPI_COMM_WORLD and MPI_COMM_SELF while a request-completion call runs.
//
// MPI_ERRORS_RETURN on the duplicate is not enough there. Open MPI raises an error of
// MPI_Waitall on the communicator of the failed request (the duplicate), but MPI_Waitall has no
// communicator argument, and MPICH raises its errors as errors tied to no object: its binding
// (src/binding/c/request/waitall.c in MPICH 4.0.2) calls MPIR_Err_return_comm(0, ...), which
// hands them to MPI_COMM_WORLD's handler (src/mpi/errhan/errutil.c), MPI_ERRORS_ARE_FATAL unless
// the user changed it, so the job aborted before wait_all() could throw. Before MPI-4.0 errors
// tied to no object went to MPI_COMM_WORLD; MPI-4.0 (section 2.8) raises them on MPI_COMM_SELF.
// So both get MPI_ERRORS_RETURN for the duration of the call. restore() (checked) puts back the
// handlers that were there (the user's); the destructor does it unchecked if an exception leaves
// first. (Other threads' errors on these two communicators also return while the call runs.)
class DefaultErrorsReturn {
 public:
  explicit DefaultErrorsReturn(const char* where) : where_(where) {
    // SMPI has no handlers to save there (oktopk/simulated_mpi.hpp), and no failures to raise.
    if constexpr (simulated_mpi) return;
    try {
      for (MPI_Comm comm : {MPI_COMM_WORLD, MPI_COMM_SELF}) {
        Saved& saved = saved_[count_];
        saved.comm = comm;
        OKTOPK_MPI_CHECK(where, MPI_Comm_get_errhandler(comm, &saved.handler));
        ++count_;  // from here on restore() puts this handler back and frees our reference
        OKTOPK_MPI_CHECK(where, MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
      }
    } catch (...) {
      put_back();
      throw;
    }
  }
  DefaultErrorsReturn(const DefaultErrorsReturn&) = delete;
  DefaultErrorsReturn& operator=(const DefaultErrorsReturn&) = delete;
  ~DefaultErrorsReturn() { put_back(); }

  void restore() {
    const auto [function, code] = put_back();
    if (code != MPI_SUCCESS) {
      impl::throw_mpi_error(where_, function, code);
    }
  }

 private:
  struct Saved {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Errhandler handler = MPI_ERRHANDLER_NULL;
  };

  // Every saved handler goes back, even after a failure; the first failure is returned.
  std::pair<const char*, int> put_back() noexcept {
    std::pair<const char*, int> first{nullptr, MPI_SUCCESS};
    while (count_ > 0) {
      Saved& saved = saved_[--count_];
      const int set = MPI_Comm_set_errhandler(saved.comm, saved.handler);
      const int freed = MPI_Errhandler_free(&saved.handler);
      if (first.second == MPI_SUCCESS && set != MPI_SUCCESS) {
        first = {"MPI_Comm_set_errhandler", set};
      }
      if (first.second == MPI_SUCCESS && freed != MPI_SUCCESS) {
        first = {"MPI_Errhandler_free", freed};
      }
    }
    return first;
  }

  const char* where_;
  Saved saved_[2];
  int count_ = 0;
};

}  // namespace

// ---- PhaseTraffic ------------------------------------------------------------------------------

PhaseTraffic& PhaseTraffic::operator+=(const PhaseTraffic& other) {
  bytes_sent += other.bytes_sent;
  bytes_received += other.bytes_received;
  messages_sent += other.messages_sent;
  messages_received += other.messages_received;
  bytes_sent_between_nodes += other.bytes_sent_between_nodes;
  bytes_received_between_nodes += other.bytes_received_between_nodes;
  return *this;
}

bool operator==(const PhaseTraffic& a, const PhaseTraffic& b) {
  return a.bytes_sent == b.bytes_sent && a.bytes_received == b.bytes_received &&
         a.messages_sent == b.messages_sent && a.messages_received == b.messages_received &&
         a.bytes_sent_between_nodes == b.bytes_sent_between_nodes &&
         a.bytes_received_between_nodes == b.bytes_received_between_nodes;
}

// ---- agreement digests -------------------------------------------------------------------------

std::int64_t agreement_digest(std::string_view text) {
  // 64-bit FNV-1a: stable across runs, platforms and compilers, unlike std::hash.
  impl::Fnv1a64 fnv;
  fnv.update(text.data(), text.size());
  const std::uint64_t hash = fnv.value();
  std::int64_t digest = 0;
  std::memcpy(&digest, &hash, sizeof digest);
  return digest;
}

std::int64_t agreement_digest(double value) {
  // The bit pattern, so that values that merely compare equal (0.0 and -0.0) still differ.
  std::int64_t digest = 0;
  static_assert(sizeof digest == sizeof value, "agreement_digest: double is not 64-bit");
  std::memcpy(&digest, &value, sizeof digest);
  return digest;
}

// ---- datatypes ---------------------------------------------------------------------------------

namespace impl {
template <>
MPI_Datatype mpi_datatype<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_datatype<double>() {
  return MPI_DOUBLE;
}
template <>
MPI_Datatype mpi_datatype<std::int32_t>() {
  return MPI_INT32_T;
}
template <>
MPI_Datatype mpi_datatype<std::int64_t>() {
  return MPI_INT64_T;
}
template <>
MPI_Datatype mpi_datatype<std::uint16_t>() {
  return MPI_UINT16_T;
}
template <>
MPI_Datatype mpi_datatype<std::uint32_t>() {
  return MPI_UINT32_T;
}
template <>
MPI_Datatype mpi_datatype<std::uint64_t>() {
  return MPI_UINT64_T;
}
template <>
MPI_Datatype mpi_datatype<char>() {
  return MPI_CHAR;
}
template <>
MPI_Datatype mpi_datatype<unsigned char>() {
  return MPI_UNSIGNED_CHAR;
}
template <>
MPI_Datatype mpi_datatype<bfloat16>() {
  return MPI_UINT16_T;
}
template <>
MPI_Datatype mpi_datatype<float16>() {
  return MPI_UINT16_T;
}
}  // namespace impl

// ---- Communicator ------------------------------------------------------------------------------

Communicator::Communicator(MPI_Comm comm) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized) {
    throw std::runtime_error(std::string(kCommunicator) + ": MPI is not initialized");
  }
  if (finalized) {
    throw std::runtime_error(std::string(kCommunicator) + ": MPI is already finalized");
  }
  OKTOPK_REQUIRE(comm != MPI_COMM_NULL, std::invalid_argument, kCommunicator,
                 "the communicator is MPI_COMM_NULL");
  state_ = std::make_shared<State>();
  // The duplicate isolates OkTopk's tags from the user's, and MPI_ERRORS_RETURN (set on the
  // duplicate only, the user's handler stays) is what makes the checks below able to fire.
  OKTOPK_MPI_CHECK(kCommunicator, MPI_Comm_dup(comm, &state_->comm));
  OKTOPK_MPI_CHECK(kCommunicator, MPI_Comm_set_errhandler(state_->comm, MPI_ERRORS_RETURN));
  OKTOPK_MPI_CHECK(kCommunicator, MPI_Comm_rank(state_->comm, &rank_));
  OKTOPK_MPI_CHECK(kCommunicator, MPI_Comm_size(state_->comm, &size_));
  nodes_ = own_nodes(rank_, size_);
}

Communicator Communicator::adopt(const char* where, MPI_Comm comm) {
  Communicator adopted{Adopted{}};
  adopted.state_ = std::make_shared<State>();
  adopted.state_->comm = comm;
  OKTOPK_MPI_CHECK(where, MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  OKTOPK_MPI_CHECK(where, MPI_Comm_rank(comm, &adopted.rank_));
  OKTOPK_MPI_CHECK(where, MPI_Comm_size(comm, &adopted.size_));
  adopted.nodes_ = own_nodes(adopted.rank_, adopted.size_);
  return adopted;
}

Communicator Communicator::with_node_map_of(const Communicator& parent, const char* where) && {
  // Each rank of this part says which rank of the parent it is, so that every rank maps this
  // part's ranks to the parent's nodes.
  std::vector<int> parent_rank(static_cast<std::size_t>(size_));
  OKTOPK_MPI_CHECK(where, MPI_Allgather(&parent.rank_, 1, MPI_INT, parent_rank.data(), 1, MPI_INT,
                                        state_->comm));
  std::vector<int> node_of_rank(parent_rank.size());
  for (std::size_t q = 0; q < parent_rank.size(); ++q) {
    node_of_rank[q] = parent.node_of(parent_rank[q]);
  }
  nodes_ = make_node_map(std::move(node_of_rank), rank_);
  return std::move(*this);
}

Communicator Communicator::with_nodes(std::vector<int> node_of_rank) const {
  constexpr const char* where = "oktopk::Communicator::with_nodes";
  OKTOPK_REQUIRE(
      node_of_rank.size() == static_cast<std::size_t>(size_), std::invalid_argument, where,
      "node_of_rank has " << node_of_rank.size() << " entries, not one per rank (" << size_ << ")");
  for (std::size_t q = 0; q < node_of_rank.size(); ++q) {
    OKTOPK_REQUIRE(node_of_rank[q] >= 0, std::invalid_argument, where,
                   "node_of_rank[" << q << "] = " << node_of_rank[q] << " is negative");
  }
  Communicator placed = *this;
  placed.nodes_ = make_node_map(std::move(node_of_rank), rank_);
  return placed;
}

int Communicator::node_of(int rank) const {
  check_rank("oktopk::Communicator::node_of", "rank", rank, size_);
  return nodes_->node_of_rank[static_cast<std::size_t>(rank)];
}

std::shared_ptr<const Communicator::NodeMap> Communicator::make_node_map(
    std::vector<int> node_of_rank, int rank) {
  auto map = std::make_shared<NodeMap>();
  const int node = node_of_rank[static_cast<std::size_t>(rank)];
  for (std::size_t q = 0; q < node_of_rank.size(); ++q) {
    if (node_of_rank[q] == node) map->same_node.push_back(static_cast<int>(q));
  }
  map->node_of_rank = std::move(node_of_rank);
  return map;
}

std::shared_ptr<const Communicator::NodeMap> Communicator::own_nodes(int rank, int size) {
  std::vector<int> node_of_rank(static_cast<std::size_t>(size));
  for (int q = 0; q < size; ++q) node_of_rank[static_cast<std::size_t>(q)] = q;
  return make_node_map(std::move(node_of_rank), rank);
}

std::int64_t Communicator::blocks_on_node(std::int64_t total) const {
  std::int64_t bytes = 0;
  for (const int q : nodes_->same_node) bytes += block_bytes(total, size_, q);
  return bytes;
}

Communicator Communicator::split(int color, int key) const {
  // A negative color joins the split as MPI_UNDEFINED, so that the ranks that passed a good one
  // are not left inside MPI_Comm_split: then every rank learns of it and throws.
  MPI_Comm part = MPI_COMM_NULL;
  OKTOPK_MPI_CHECK(kSplit,
                   MPI_Comm_split(state_->comm, color >= 0 ? color : MPI_UNDEFINED, key, &part));
  std::optional<Communicator> adopted;
  if (part != MPI_COMM_NULL) adopted = adopt(kSplit, part);
  const AgreedFailure negative = agree_on_failure(color < 0, "", color);
  OKTOPK_REQUIRE(!negative, std::invalid_argument, kSplit,
                 "colors must be >= 0, rank " << negative.rank << " passed " << negative.code);
  return std::move(*adopted).with_node_map_of(*this, kSplit);
}

Communicator Communicator::split_shared_memory() const {
  MPI_Comm node = MPI_COMM_NULL;
  OKTOPK_MPI_CHECK(kSplitSharedMemory, MPI_Comm_split_type(state_->comm, MPI_COMM_TYPE_SHARED,
                                                           rank_, MPI_INFO_NULL, &node));
  return adopt(kSplitSharedMemory, node).with_node_map_of(*this, kSplitSharedMemory);
}

MPI_Comm Communicator::mpi_comm() const { return state_->comm; }

std::int64_t Communicator::next_serial() const { return state_->serials++; }

// ---- traffic accounting ------------------------------------------------------------------------

Communicator::PhaseScope::PhaseScope(const Communicator& comm, std::string previous)
    : state_(comm.state_), previous_(std::move(previous)) {}

Communicator::PhaseScope::PhaseScope(PhaseScope&& other) noexcept
    : state_(std::move(other.state_)), previous_(std::move(other.previous_)) {}

Communicator::PhaseScope::~PhaseScope() {
  if (state_) {  // null when moved from
    state_->phase = std::move(previous_);
  }
}

Communicator::PhaseScope Communicator::phase(const std::string& name) const {
  return PhaseScope(*this, std::exchange(state_->phase, name));
}

const std::string& Communicator::current_phase() const { return state_->phase; }

std::map<std::string, PhaseTraffic> Communicator::traffic() const { return state_->traffic; }

PhaseTraffic Communicator::traffic(const std::string& phase) const {
  const auto it = state_->traffic.find(phase);
  return it == state_->traffic.end() ? PhaseTraffic{} : it->second;
}

PhaseTraffic Communicator::total_traffic() const {
  PhaseTraffic total;
  for (const auto& entry : state_->traffic) {
    total += entry.second;
  }
  return total;
}

void Communicator::reset_traffic() {
  state_->traffic.clear();
  state_->message_log.clear();
}

void Communicator::set_message_log(bool enabled) {
  state_->log_messages = enabled;
  if (!enabled) {
    // Keeps "empty while the log is off" true, and gives the memory back.
    std::vector<MessageRecord>().swap(state_->message_log);
  }
}

bool Communicator::message_log_enabled() const { return state_->log_messages; }

const std::vector<MessageRecord>& Communicator::message_log() const { return state_->message_log; }

void Communicator::charge(const char* operation, int peer, const PhaseTraffic& traffic) const {
  state_->charge(state_->phase, operation, peer, traffic);
}

// ---- point to point ----------------------------------------------------------------------------

Communicator::Requests& Communicator::Requests::operator=(Requests&& other) noexcept {
  if (this != &other) {
    // Dropping our own requests would leave MPI writing into buffers their owner may free.
    if (!requests_.empty()) {
      try {
        wait_all();
      } catch (...) {
      }
    }
    state_ = std::move(other.state_);
    requests_ = std::move(other.requests_);
    receives_ = std::move(other.receives_);
    other.requests_.clear();
    other.receives_.clear();
  }
  return *this;
}

Communicator::Requests::~Requests() {
  if (requests_.empty()) {
    return;
  }
  if (std::uncaught_exceptions() > 0) {
    // Unwinding from a failure on this rank: the peers may never send what we wait for (they
    // may be waiting for us), so waiting here could hang forever. Abandon the operations
    // instead; the caller ends the job (SparseAllreduce calls MPI_Abort) before the buffers
    // matter. Failures of these calls are ignored: there is nothing left to report them to.
    for (MPI_Request& request : requests_) {
      if (request != MPI_REQUEST_NULL) {
        MPI_Cancel(&request);
        MPI_Request_free(&request);
      }
    }
    return;
  }
  try {
    wait_all();
  } catch (...) {
    // A destructor must not throw; wait_all() completed or abandoned what it could.
  }
}

void Communicator::Requests::wait_all() {
  if (requests_.empty()) {
    return;
  }
  std::vector<MPI_Status> statuses(requests_.size());
  DefaultErrorsReturn errors_return(kWaitAll);
  const int code =
      MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), statuses.data());
  errors_return.restore();
  if (code != MPI_SUCCESS) {
    // MPI_ERR_IN_STATUS only says that some request failed; report the first real cause.
    int cause = code;
    if (code == MPI_ERR_IN_STATUS) {
      for (const MPI_Status& status : statuses) {
        if (status.MPI_ERROR != MPI_SUCCESS && status.MPI_ERROR != MPI_ERR_PENDING) {
          cause = status.MPI_ERROR;
          break;
        }
      }
    }
    // Completed requests are now MPI_REQUEST_NULL; keep the pending ones so that the destructor
    // still waits for them before their buffers go away. Their receives are not charged.
    requests_.erase(std::remove(requests_.begin(), requests_.end(), MPI_REQUEST_NULL),
                    requests_.end());
    receives_.clear();
    impl::throw_mpi_error(kWaitAll, "MPI_Waitall", cause);
  }
  for (const Receive& receive : receives_) {
    if (!receive.counted) {
      continue;
    }
    int count = 0;
    OKTOPK_MPI_CHECK(kWaitAll, MPI_Get_count(&statuses[receive.request], receive.type, &count));
    OKTOPK_REQUIRE(count != MPI_UNDEFINED, std::runtime_error, kWaitAll,
                   "a received message is not a whole number of its datatype");
    const std::int64_t bytes = count * type_size(kWaitAll, receive.type);
    state_->charge(receive.phase, "recv", receive.source,
                   PhaseTraffic{0, bytes, 0, 1, 0, receive.between_nodes ? bytes : 0});
  }
  requests_.clear();
  receives_.clear();
}

void Communicator::isend_bytes(const void* buffer, count_type count, MPI_Datatype type,
                               int destination, int tag, Requests& requests) const {
  const int n = checked_count(kIsend, "count", count);
  check_rank(kIsend, "destination", destination, size_);
  OKTOPK_REQUIRE(requests.requests_.empty() || requests.state_ == state_, std::invalid_argument,
                 kIsend, "the requests hold operations of another communicator");
  const std::int64_t bytes = count * type_size(kIsend, type);
  MPI_Request request = MPI_REQUEST_NULL;
  OKTOPK_MPI_CHECK(kIsend, MPI_Isend(buffer, n, type, destination, tag, state_->comm, &request));
  requests.state_ = state_;
  requests.requests_.push_back(request);
  if (destination != rank_) {
    const bool between = node_of(destination) != node_of(rank_);
    charge("send", destination, PhaseTraffic{bytes, 0, 1, 0, between ? bytes : 0, 0});
  }
}

void Communicator::irecv_bytes(void* buffer, count_type count, MPI_Datatype type, int source,
                               int tag, Requests& requests) const {
  const int n = checked_count(kIrecv, "count", count);
  check_rank(kIrecv, "source", source, size_);
  OKTOPK_REQUIRE(requests.requests_.empty() || requests.state_ == state_, std::invalid_argument,
                 kIrecv, "the requests hold operations of another communicator");
  MPI_Request request = MPI_REQUEST_NULL;
  OKTOPK_MPI_CHECK(kIrecv, MPI_Irecv(buffer, n, type, source, tag, state_->comm, &request));
  requests.state_ = state_;
  requests.requests_.push_back(request);
  // Charged at completion with the actual size, but to the phase it was posted in.
  requests.receives_.push_back(Requests::Receive{requests.requests_.size() - 1, type, state_->phase,
                                                 source, source != rank_,
                                                 node_of(source) != node_of(rank_)});
}

// ---- collectives ------------------------------------------------------------------------------
// MPI hides the traffic inside these, so each is charged the per-rank volume of a
// bandwidth-optimal algorithm (formulas in the header). They keep the sum of bytes sent over
// ranks equal to the sum received, which the tests check, and so do their parts between nodes:
// each block goes to or comes from its peer directly, so it is between nodes when that peer is
// on another node (L = ranks on this rank's node, blocks_on_node = the blocks of those ranks).

void Communicator::allreduce_impl(const void* send, void* receive, count_type count,
                                  MPI_Datatype type, MPI_Op op) const {
  const int n = checked_count(kAllreduce, "count", count);
  const std::int64_t bytes = count * type_size(kAllreduce, type);
  OKTOPK_MPI_CHECK(kAllreduce, MPI_Allreduce(send, receive, n, type, op, state_->comm));
  // Reduce-scatter: send every block but our own, receive our block from each other rank;
  // allgather: the reverse.
  const std::int64_t own = block_bytes(bytes, size_, rank_);
  const std::int64_t volume = (bytes - own) + (size_ - 1) * own;
  const std::int64_t between = (bytes - blocks_on_node(bytes)) + (size_ - ranks_on_node()) * own;
  charge("allreduce", -1,
         PhaseTraffic{volume, volume, 2 * (size_ - 1), 2 * (size_ - 1), between, between});
}

void Communicator::alltoall_impl(const void* send, void* receive, count_type count,
                                 MPI_Datatype type) const {
  const int n = checked_count(kAlltoall, "count_per_rank", count);
  const std::int64_t bytes = count * type_size(kAlltoall, type);
  OKTOPK_MPI_CHECK(kAlltoall, MPI_Alltoall(send, n, type, receive, n, type, state_->comm));
  // Exact: one block to and from every other rank; the block to ourselves is a local copy.
  const std::int64_t between = (size_ - ranks_on_node()) * bytes;
  charge("alltoall", -1,
         PhaseTraffic{(size_ - 1) * bytes, (size_ - 1) * bytes, size_ - 1, size_ - 1, between,
                      between});
}

void Communicator::allgather_impl(const void* send, count_type count, void* receive,
                                  MPI_Datatype type) const {
  const int n = checked_count(kAllgather, "count", count);
  const std::int64_t bytes = count * type_size(kAllgather, type);
  OKTOPK_MPI_CHECK(kAllgather, MPI_Allgather(send, n, type, receive, n, type, state_->comm));
  // allgatherv with equal counts: c_r = bytes, T = P * bytes.
  const std::int64_t between = (size_ - ranks_on_node()) * bytes;
  charge("allgather", -1,
         PhaseTraffic{(size_ - 1) * bytes, (size_ - 1) * bytes, size_ - 1, size_ - 1, between,
                      between});
}

void Communicator::allgatherv_impl(const void* send, count_type count, void* receive,
                                   const int* counts, const int* displacements,
                                   MPI_Datatype type) const {
  const int n = checked_count(kAllgatherv, "count", count);
  OKTOPK_REQUIRE(counts != nullptr && displacements != nullptr, std::invalid_argument, kAllgatherv,
                 "counts and displacements must not be null");
  count_type total = 0;
  for (int r = 0; r < size_; ++r) {
    OKTOPK_REQUIRE(counts[r] >= 0, std::invalid_argument, kAllgatherv,
                   "counts[" << r << "] = " << counts[r] << " is negative");
    total += counts[r];
  }
  // MPI would call this a type-signature mismatch, or silently truncate; it is a caller's bug.
  OKTOPK_REQUIRE(
      counts[rank_] == n, std::invalid_argument, kAllgatherv,
      "count = " << count << " differs from counts[" << rank_ << "] = " << counts[rank_]);
  const std::int64_t size = type_size(kAllgatherv, type);
  OKTOPK_MPI_CHECK(kAllgatherv, MPI_Allgatherv(send, n, type, receive, counts, displacements, type,
                                               state_->comm));
  const std::int64_t own = count * size;
  std::int64_t on_node = 0;
  for (const int q : nodes_->same_node) on_node += counts[q];
  charge("allgatherv", -1,
         PhaseTraffic{(size_ - 1) * own, total * size - own, size_ - 1, size_ - 1,
                      (size_ - ranks_on_node()) * own, (total - on_node) * size});
}

void Communicator::bcast_impl(void* buffer, count_type count, MPI_Datatype type, int root) const {
  const int n = checked_count(kBcast, "count", count);
  check_rank(kBcast, "root", root, size_);
  const std::int64_t bytes = count * type_size(kBcast, type);
  OKTOPK_MPI_CHECK(kBcast, MPI_Bcast(buffer, n, type, root, state_->comm));
  // Scatter from the root, then allgather of the scattered blocks.
  const std::int64_t own = block_bytes(bytes, size_, rank_);
  // Blocks that come from or go to ranks on other nodes, in the scatter and in the allgather.
  const std::int64_t off_node = bytes - blocks_on_node(bytes);
  const std::int64_t own_between = (size_ - ranks_on_node()) * own;
  if (rank_ == root) {
    charge("bcast", -1,
           PhaseTraffic{(bytes - own) + (size_ - 1) * own, bytes - own, 2 * (size_ - 1), size_ - 1,
                        off_node + own_between, off_node});
  } else {
    const bool root_between = node_of(root) != node_of(rank_);
    charge("bcast", -1,
           PhaseTraffic{(size_ - 1) * own, bytes, size_ - 1, size_, own_between,
                        (root_between ? own : 0) + off_node});
  }
}

void Communicator::reduce_scatter_impl(const void* send, void* receive, const int* counts,
                                       MPI_Datatype type, MPI_Op op) const {
  OKTOPK_REQUIRE(counts != nullptr, std::invalid_argument, kReduceScatter,
                 "counts must not be null");
  count_type total = 0;
  count_type on_node = 0;
  for (int r = 0; r < size_; ++r) {
    OKTOPK_REQUIRE(counts[r] >= 0, std::invalid_argument, kReduceScatter,
                   "counts[" << r << "] = " << counts[r] << " is negative");
    total += counts[r];
  }
  for (const int q : nodes_->same_node) on_node += counts[q];
  OKTOPK_REQUIRE(total <= INT_MAX, std::invalid_argument, kReduceScatter,
                 "the counts add up to " << total << ", more than one MPI call can address");
  const std::int64_t size = type_size(kReduceScatter, type);
  // MPI_Reduce_scatter takes a non-const count array in MPI 2.
  std::vector<int> block_counts(counts, counts + size_);
  OKTOPK_MPI_CHECK(kReduceScatter,
                   MPI_Reduce_scatter(send, receive, block_counts.data(), type, op, state_->comm));
  const std::int64_t own = counts[rank_] * size;
  charge("reduce_scatter", -1,
         PhaseTraffic{total * size - own, (size_ - 1) * own, size_ - 1, size_ - 1,
                      (total - on_node) * size, (size_ - ranks_on_node()) * own});
}

void Communicator::reduce_scatter_block_impl(const void* send, void* receive, count_type count,
                                             MPI_Datatype type, MPI_Op op) const {
  const int n = checked_count(kReduceScatterBlock, "count_per_rank", count);
  const std::int64_t bytes = count * type_size(kReduceScatterBlock, type);
  OKTOPK_MPI_CHECK(kReduceScatterBlock,
                   MPI_Reduce_scatter_block(send, receive, n, type, op, state_->comm));
  const std::int64_t others = (size_ - 1) * bytes;
  const std::int64_t between = (size_ - ranks_on_node()) * bytes;
  charge("reduce_scatter", -1,
         PhaseTraffic{others, others, size_ - 1, size_ - 1, between, between});
}

void Communicator::barrier() const { OKTOPK_MPI_CHECK(kBarrier, MPI_Barrier(state_->comm)); }

// ---- agreement ---------------------------------------------------------------------------------

void Communicator::check_agreement(const char* caller,
                                   std::initializer_list<AgreementField> fields) const {
  if (fields.size() == 0) {
    return;
  }
  // One MAX reduction gives both extremes: max(~v) = ~min(v), and ~ cannot overflow where -v
  // would (for INT64_MIN).
  std::vector<std::int64_t> extremes;
  extremes.reserve(2 * fields.size());
  for (const AgreementField& field : fields) {
    extremes.push_back(field.value);
    extremes.push_back(~field.value);
  }
  allreduce_in_place(extremes.data(), static_cast<count_type>(extremes.size()), MPI_MAX);
  // Every rank sees the same reduced values, so every rank throws the same message.
  std::size_t i = 0;
  for (const AgreementField& field : fields) {
    const std::int64_t largest = extremes[2 * i];
    const std::int64_t smallest = ~extremes[2 * i + 1];
    OKTOPK_REQUIRE(smallest == largest, std::invalid_argument,
                   caller != nullptr ? caller : kCheckAgreement,
                   field.name << " differs across ranks (smallest " << smallest << ", largest "
                              << largest << ")");
    ++i;
  }
}

AgreedFailure Communicator::agree_on_failure(bool failed, const std::string& cause,
                                             std::int64_t code) const {
  // {size - the lowest failing rank, whether some rank succeeded}: one MAX reduction gives both.
  std::int64_t outcome[2] = {failed ? size_ - rank_ : 0, failed ? 0 : 1};
  allreduce_in_place(outcome, 2, MPI_MAX);
  AgreedFailure agreed;
  if (outcome[0] == 0) return agreed;
  agreed.rank = size_ - static_cast<int>(outcome[0]);
  agreed.every_rank = outcome[1] == 0;
  // Cut so that the length is a valid MPI count whatever the cause.
  constexpr std::size_t longest = 65536;
  std::int64_t head[2] = {code, static_cast<std::int64_t>(std::min(cause.size(), longest))};
  bcast(head, 2, agreed.rank);
  agreed.code = head[0];
  agreed.cause.assign(static_cast<std::size_t>(head[1]), '\0');
  if (rank_ == agreed.rank) agreed.cause.assign(cause, 0, static_cast<std::size_t>(head[1]));
  bcast(agreed.cause.data(), head[1], agreed.rank);
  return agreed;
}

}  // namespace oktopk

// SPDX-License-Identifier: BSD-3-Clause
// The one place OkTopk talks to MPI: a duplicated communicator whose every call is checked,
// with per-phase traffic accounting and a cross-rank agreement check.
#pragma once

#include <oktopk/fwd.hpp>

#include <mpi.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace oktopk {

/// \brief Bytes and messages this rank sent and received.
struct PhaseTraffic {
  std::int64_t bytes_sent = 0;
  std::int64_t bytes_received = 0;
  std::int64_t messages_sent = 0;
  std::int64_t messages_received = 0;
  /// Of bytes_sent and bytes_received, those to and from ranks on other nodes, by the node map
  /// of the Communicator that charged them (Communicator::with_nodes).
  std::int64_t bytes_sent_between_nodes = 0;
  std::int64_t bytes_received_between_nodes = 0;

  std::int64_t bytes_sent_inside_node() const { return bytes_sent - bytes_sent_between_nodes; }
  std::int64_t bytes_received_inside_node() const {
    return bytes_received - bytes_received_between_nodes;
  }
  PhaseTraffic& operator+=(const PhaseTraffic& other);
};

bool operator==(const PhaseTraffic& a, const PhaseTraffic& b);

/// \brief One charge of the traffic accounting, as the optional message log records it: a
/// point-to-point message (`peer` >= 0), or one collective call (`peer` = -1) with the
/// per-rank volume the accounting charges it (formulas at Communicator).
struct MessageRecord {
  std::string phase;      ///< the phase it was charged to
  const char* operation;  ///< "send", "recv", or the collective: "allreduce", "alltoall",
                          ///< "allgather", "allgatherv", "bcast" (static strings)
  int peer;               ///< destination (send), source (recv), or -1 (collective)
  std::int64_t bytes_sent;
  std::int64_t bytes_received;
  std::int64_t messages_sent;
  std::int64_t messages_received;
  std::int64_t bytes_sent_between_nodes;  ///< of bytes_sent, to ranks on other nodes
  std::int64_t bytes_received_between_nodes;
};

/// \brief One named value in Communicator::check_agreement.
struct AgreementField {
  const char* name;
  std::int64_t value;
};

/// \brief What every rank learns from Communicator::agree_on_failure: the same on every rank.
struct AgreedFailure {
  int rank = -1;            ///< the lowest rank that failed; -1 when none did
  bool every_rank = false;  ///< whether every rank failed
  std::int64_t code = 0;    ///< the code that rank passed
  std::string cause;        ///< the cause that rank passed
  /// Whether some rank failed.
  explicit operator bool() const { return rank >= 0; }
};

/// \brief A stable 64-bit digest of a string (FNV-1a), for agreement checks on text options.
std::int64_t agreement_digest(std::string_view text);

/// \brief The bit pattern of a double, for agreement checks on floating-point options.
std::int64_t agreement_digest(double value);

/// \brief RAII over a duplicate of a user's MPI communicator.
///
/// The duplicate has MPI_ERRORS_RETURN, and every call is checked: a failing call throws
/// std::runtime_error whose message starts with the calling function's qualified name and holds
/// MPI's error string. Requests::wait_all() also sets MPI_ERRORS_RETURN on MPI_COMM_WORLD and
/// MPI_COMM_SELF while MPI_Waitall runs (MPICH raises its errors there, not on the duplicate) and
/// then puts the user's handlers back. Copies share the duplicate and the traffic counters; the
/// duplicate is freed with the last copy (unless MPI is already finalized).
///
/// Traffic accounting. Every byte is charged to the current phase (see phase()). Point-to-point
/// and all-to-all traffic is counted exactly, excluding a rank's messages to itself; a receive is
/// counted when it completes, with its actual size. MPI hides the internal traffic of
/// allreduce, allgather(v) and bcast, so those are charged the per-rank volume of a
/// bandwidth-optimal algorithm, computed from the exact block partition of the data
/// (B bytes split into P blocks b_r = B/P, the first B mod P one byte larger):
///   allreduce  (reduce-scatter + allgather): sent = received = (B - b_r) + (P-1)·b_r,
///              messages 2(P-1) each way;
///   allgatherv (every block reaches every other rank once, c_r = this rank's bytes,
///              T = total): sent = (P-1)·c_r, received = T - c_r, messages P-1 each way;
///   reduce_scatter (each block c_q goes straight to rank q; c_r = this rank's block, T = total):
///              sent = T - c_r, received = (P-1)·c_r, messages P-1 each way (and
///              reduce_scatter_block, with c_q = c for every q);
///   bcast      (scatter + allgather, root q): root sent (B - b_q) + (P-1)·b_q, received B - b_q;
///              others sent (P-1)·b_r, received B; messages P-1 each way for the allgather,
///              plus the scatter's: P-1 sent by the root, one received by each other rank.
/// These make sent and received totals over all ranks equal, as real traffic does.
///
/// Inside and between nodes. Each byte charged is also split by where its peer runs: a rank on
/// this rank's node, or on another (PhaseTraffic's *_between_nodes), by the node map given to
/// with_nodes(); without one, every rank counts as a node of its own, so all traffic is between
/// nodes. Point-to-point and all-to-all bytes go by their peer. The collectives above are split
/// by the blocks of the same algorithm, each block exchanged with its peer directly: the
/// allreduce's block b_q and the allgather(v)'s c_q cross a node's boundary when q and this
/// rank are on different nodes; so do the bcast's allgather blocks, and its scatter's block b_r
/// when the root and rank r are. MPI's own algorithm may move more or fewer bytes between nodes
/// than this charges (it depends on the algorithm and on how the ranks are placed); a collective
/// whose ranks all share a node, or all sit on different nodes, is split exactly.
class Communicator {
  // Declared first: PhaseScope and Requests hold it, so that neither dangles when the
  // Communicator they came from is moved or destroyed before them.
  struct State;

 public:
  /// Duplicates `comm`. Throws std::runtime_error if MPI is not initialized, or
  /// std::invalid_argument for MPI_COMM_NULL.
  explicit Communicator(MPI_Comm comm = MPI_COMM_WORLD);

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// The duplicated communicator (for calls OkTopk does not wrap; they are not accounted).
  MPI_Comm mpi_comm() const;

  /// \brief Collective. A communicator of the ranks that pass the same `color` (>= 0), ranked
  /// by `key` (ties by rank in this one), as MPI_Comm_split makes it, with this class's checks
  /// and traffic counters of its own, and this one's node map. Throws std::invalid_argument on
  /// every rank, naming the lowest such rank, if any rank passes a negative color.
  Communicator split(int color, int key) const;
  /// \brief Collective. A communicator of the ranks that can share memory with this one
  /// (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED: the ranks of one node), ranked as here,
  /// with traffic counters of its own and this one's node map.
  Communicator split_shared_memory() const;

  /// \brief Not collective. A copy of this communicator (the same duplicate and traffic
  /// counters) that charges traffic inside and between nodes by `node_of_rank`: rank q runs on
  /// node node_of_rank[q] (NodeTopology::node_of_rank()). The map is the copy's own, so that
  /// handles made over one communicator with different node sizes each keep theirs. Throws
  /// std::invalid_argument unless `node_of_rank` has size() entries, none negative.
  Communicator with_nodes(std::vector<int> node_of_rank) const;
  /// Rank q's node in this communicator's node map (its own rank when none was given).
  int node_of(int rank) const;

  /// \brief 0, 1, 2, ...: one number per call, shared by this communicator and its copies.
  /// Objects made collectively, in the same order on every rank, from one Communicator (the
  /// SparseAllreduce handles) get the same number on every rank, so a later call can check
  /// that every rank is working on the same object. Thread-safe.
  std::int64_t next_serial() const;

  // ---- traffic accounting -------------------------------------------------------------------

  /// \brief While the returned guard lives, traffic is charged to phase `name`; the previous
  /// phase is restored when it ends. The phase before any guard is "other".
  class PhaseScope {
   public:
    PhaseScope(PhaseScope&& other) noexcept;
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;
    PhaseScope& operator=(PhaseScope&&) = delete;
    ~PhaseScope();

   private:
    friend class Communicator;
    PhaseScope(const Communicator& comm, std::string previous);
    std::shared_ptr<State> state_;
    std::string previous_;
  };

  [[nodiscard]] PhaseScope phase(const std::string& name) const;
  const std::string& current_phase() const;

  /// Traffic since the last reset, by phase (phases with no traffic are absent).
  std::map<std::string, PhaseTraffic> traffic() const;
  /// Traffic of one phase (zero if it had none).
  PhaseTraffic traffic(const std::string& phase) const;
  /// The sum over all phases.
  PhaseTraffic total_traffic() const;
  /// Clears the traffic counters and the message log.
  void reset_traffic();

  /// \brief Turns the message log on or off (off by default; shared with copies). While on,
  /// every charge of the accounting above is also appended, in the order it is charged, as one
  /// MessageRecord: a send when it is posted, a receive when wait_all() completes it, a
  /// collective when it returns; messages to self are not charged and not logged. It is what
  /// an alpha-beta model of a run needs (how many messages, how large, to whom), which the
  /// per-phase sums cannot give. Off, the cost is one untaken branch per charge.
  void set_message_log(bool enabled);
  bool message_log_enabled() const;
  /// The records since the last reset_traffic() (empty while the log is off).
  const std::vector<MessageRecord>& message_log() const;

  // ---- point to point -----------------------------------------------------------------------

  /// \brief Outstanding nonblocking operations. The buffers must stay alive and untouched until
  /// wait_all() returns; the destructor waits for anything still outstanding (and never throws).
  /// Destroyed while an exception unwinds, it never waits: it cancels and frees what is still
  /// outstanding, since the peers may be waiting for this rank and never complete it. Its
  /// buffers may then still be read or written by MPI: end the job (MPI_Abort), as
  /// SparseAllreduce does for failures in its calls (docs/reference.md, "Failures").
  class Requests {
   public:
    Requests() = default;
    Requests(const Requests&) = delete;
    Requests& operator=(const Requests&) = delete;
    Requests(Requests&&) noexcept = default;
    Requests& operator=(Requests&&) noexcept;
    ~Requests();

    /// Completes every operation and charges received bytes. Throws std::runtime_error if MPI
    /// reports an error for any of them.
    void wait_all();
    std::size_t size() const { return requests_.size(); }

   private:
    friend class Communicator;
    struct Receive {
      std::size_t request;  // position in requests_
      MPI_Datatype type;
      std::string phase;
      int source;          // for the message log
      bool counted;        // false for self-messages
      bool between_nodes;  // the source is on another node
    };
    std::shared_ptr<State> state_;  // of the Communicator that posted them
    std::vector<MPI_Request> requests_;
    std::vector<Receive> receives_;
  };

  template <class T>
  void isend(const T* buffer, count_type count, int destination, int tag, Requests& requests) const;
  template <class T>
  void irecv(T* buffer, count_type count, int source, int tag, Requests& requests) const;

  // ---- collectives --------------------------------------------------------------------------
  // Counts are in elements. Buffers are host memory, or device memory when MPI is GPU-aware.

  template <class T>
  void allreduce(const T* send, T* receive, count_type count, MPI_Op op) const;
  template <class T>
  void allreduce_in_place(T* buffer, count_type count, MPI_Op op) const;
  /// Every rank sends `count_per_rank` elements to every rank (itself included).
  template <class T>
  void alltoall(const T* send, T* receive, count_type count_per_rank) const;
  template <class T>
  void allgather(const T* send, count_type count, T* receive) const;
  /// `counts` and `displacements` have size() entries each, in elements.
  template <class T>
  void allgatherv(const T* send, count_type count, T* receive, const int* counts,
                  const int* displacements) const;
  template <class T>
  void bcast(T* buffer, count_type count, int root) const;
  /// MPI_Reduce_scatter: `send` holds counts[0] + ... + counts[P-1] elements, and this rank
  /// receives the reduction of block rank() (counts[rank()] elements). `counts` has size()
  /// entries.
  template <class T>
  void reduce_scatter(const T* send, T* receive, const int* counts, MPI_Op op) const;
  /// MPI_Reduce_scatter_block: `send` holds size() blocks of `count_per_rank` elements, and this
  /// rank receives the reduction of block rank().
  template <class T>
  void reduce_scatter_block(const T* send, T* receive, count_type count_per_rank, MPI_Op op) const;
  void barrier() const;

  // ---- agreement ----------------------------------------------------------------------------

  /// \brief Collective. Checks that every field has the same value on every rank; if one does
  /// not, every rank throws the same std::invalid_argument, starting with `caller` and naming
  /// the field with its smallest and largest value, instead of hanging later in mismatched
  /// collectives.
  void check_agreement(const char* caller, std::initializer_list<AgreementField> fields) const;

  /// \brief Collective. Agrees on a failure that may have hit some ranks only: each rank says
  /// whether it failed, with its cause and a code of the caller's choosing, and every rank
  /// returns the lowest failing rank's cause and code, so that every rank can throw the same
  /// exception, naming that rank and why it failed, instead of some going on to collectives the
  /// others never join. One allreduce of two integers when no rank failed, two broadcasts more
  /// when one did. A cause longer than 65536 characters arrives cut to that length.
  AgreedFailure agree_on_failure(bool failed, const std::string& cause = std::string(),
                                 std::int64_t code = 0) const;

 private:
  // Which node each rank runs on, and this rank's node's ranks (this rank included).
  struct NodeMap {
    std::vector<int> node_of_rank;
    std::vector<int> same_node;
  };
  static std::shared_ptr<const NodeMap> make_node_map(std::vector<int> node_of_rank, int rank);
  // Every rank a node of its own: the map of a communicator nobody placed.
  static std::shared_ptr<const NodeMap> own_nodes(int rank, int size);
  // Collective over this (a part split from `parent`): this part's ranks on the parent's nodes.
  Communicator with_node_map_of(const Communicator& parent, const char* where) &&;

  void charge(const char* operation, int peer, const PhaseTraffic& traffic) const;
  // Ranks on this rank's node (L), and the bytes of blocks q on this rank's node, the blocks
  // being `total` bytes split as the collectives' accounting splits them.
  int ranks_on_node() const { return static_cast<int>(nodes_->same_node.size()); }
  std::int64_t blocks_on_node(std::int64_t total) const;

  void isend_bytes(const void* buffer, count_type count, MPI_Datatype type, int destination,
                   int tag, Requests& requests) const;
  void irecv_bytes(void* buffer, count_type count, MPI_Datatype type, int source, int tag,
                   Requests& requests) const;
  void allreduce_impl(const void* send, void* receive, count_type count, MPI_Datatype type,
                      MPI_Op op) const;
  void alltoall_impl(const void* send, void* receive, count_type count, MPI_Datatype type) const;
  void allgather_impl(const void* send, count_type count, void* receive, MPI_Datatype type) const;
  void allgatherv_impl(const void* send, count_type count, void* receive, const int* counts,
                       const int* displacements, MPI_Datatype type) const;
  void bcast_impl(void* buffer, count_type count, MPI_Datatype type, int root) const;
  void reduce_scatter_impl(const void* send, void* receive, const int* counts, MPI_Datatype type,
                           MPI_Op op) const;
  void reduce_scatter_block_impl(const void* send, void* receive, count_type count,
                                 MPI_Datatype type, MPI_Op op) const;

  // A Communicator that owns `comm` (freed with its last copy, also when this throws).
  static Communicator adopt(const char* where, MPI_Comm comm);
  struct Adopted {};
  explicit Communicator(Adopted) {}

  std::shared_ptr<State> state_;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<const NodeMap> nodes_;
};

namespace impl {
/// The MPI datatype of T; specialized for the arithmetic types OkTopk sends.
template <class T>
MPI_Datatype mpi_datatype();
// Declared here so that no translation unit instantiates the (undefined) primary template.
template <>
MPI_Datatype mpi_datatype<float>();
template <>
MPI_Datatype mpi_datatype<double>();
template <>
MPI_Datatype mpi_datatype<std::int32_t>();
template <>
MPI_Datatype mpi_datatype<std::int64_t>();
template <>
MPI_Datatype mpi_datatype<std::uint16_t>();
template <>
MPI_Datatype mpi_datatype<std::uint32_t>();
template <>
MPI_Datatype mpi_datatype<std::uint64_t>();
template <>
MPI_Datatype mpi_datatype<char>();
template <>
MPI_Datatype mpi_datatype<unsigned char>();
/// The 16-bit floating types travel as their bit patterns (MPI has no such type to reduce).
template <>
MPI_Datatype mpi_datatype<bfloat16>();
template <>
MPI_Datatype mpi_datatype<float16>();
}  // namespace impl

template <class T>
void Communicator::isend(const T* buffer, count_type count, int destination, int tag,
                         Requests& requests) const {
  isend_bytes(buffer, count, impl::mpi_datatype<T>(), destination, tag, requests);
}

template <class T>
void Communicator::irecv(T* buffer, count_type count, int source, int tag,
                         Requests& requests) const {
  irecv_bytes(buffer, count, impl::mpi_datatype<T>(), source, tag, requests);
}

template <class T>
void Communicator::allreduce(const T* send, T* receive, count_type count, MPI_Op op) const {
  allreduce_impl(send, receive, count, impl::mpi_datatype<T>(), op);
}

template <class T>
void Communicator::allreduce_in_place(T* buffer, count_type count, MPI_Op op) const {
  allreduce_impl(MPI_IN_PLACE, buffer, count, impl::mpi_datatype<T>(), op);
}

template <class T>
void Communicator::alltoall(const T* send, T* receive, count_type count_per_rank) const {
  alltoall_impl(send, receive, count_per_rank, impl::mpi_datatype<T>());
}

template <class T>
void Communicator::allgather(const T* send, count_type count, T* receive) const {
  allgather_impl(send, count, receive, impl::mpi_datatype<T>());
}

template <class T>
void Communicator::allgatherv(const T* send, count_type count, T* receive, const int* counts,
                              const int* displacements) const {
  allgatherv_impl(send, count, receive, counts, displacements, impl::mpi_datatype<T>());
}

template <class T>
void Communicator::bcast(T* buffer, count_type count, int root) const {
  bcast_impl(buffer, count, impl::mpi_datatype<T>(), root);
}

template <class T>
void Communicator::reduce_scatter(const T* send, T* receive, const int* counts, MPI_Op op) const {
  reduce_scatter_impl(send, receive, counts, impl::mpi_datatype<T>(), op);
}

template <class T>
void Communicator::reduce_scatter_block(const T* send, T* receive, count_type count_per_rank,
                                        MPI_Op op) const {
  reduce_scatter_block_impl(send, receive, count_per_rank, impl::mpi_datatype<T>(), op);
}

}  // namespace oktopk

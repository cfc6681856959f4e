// SPDX-License-Identifier: BSD-3-Clause
// oktopk-train's checkpoints: one file per rank, PREFIX.rank<R>, holding the run's settings, its
// position, the model, the momentum buffer and the rank's SparseAllreduce state. Written to a
// temporary file and renamed only once every rank has written its own, so an existing
// checkpoint is never half-overwritten; read back with every rank's problems reported alike.
#pragma once

#include <oktopk/communicator.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace oktopk::train {

/// \brief Where a run stands: the next step to take, and what its epoch has summed so far.
struct TrainingProgress {
  std::int64_t epoch = 1;        ///< epoch of the next step, from 1
  std::int64_t step = 0;         ///< that step within its epoch, from 0
  std::int64_t global_step = 0;  ///< steps taken since the start of training
  double lr = 0.0;               ///< learning rate of the next step
  double loss_sum = 0.0;         ///< the epoch's sums so far, for its printed line
  double bytes_sum = 0.0;
  double density_sum = 0.0;
  double final_accuracy = 0.0;  ///< test metric after the last finished epoch (lstm: perplexity)
};

/// \brief What one rank saves. `settings` are (name, value) pairs that a resumed run must
/// repeat exactly (model, method, schedule, ranks, ...).
struct TrainingCheckpoint {
  std::vector<std::pair<std::string, std::string>> settings;
  std::int32_t rank = 0;
  std::int32_t ranks = 1;
  TrainingProgress progress;
  std::vector<float> parameters;
  std::vector<float> velocity;
  std::string allreduce_state;  ///< SparseAllreduce::save_state's bytes
};

/// PREFIX.rank<R>: the file of rank R.
std::string checkpoint_file(const std::string& prefix, int rank);

/// \brief The file's bytes, in the section format of oktopk/section_file.hpp: "OKTOPKTR", a u32
/// version, then the sections SETT (settings, "name=value" lines), PROG (rank, ranks,
/// progress), PARM and VELO (a u64 count, then floats), HNDL (the allreduce state).
std::string encode_checkpoint(const TrainingCheckpoint& checkpoint);

/// \brief The inverse of encode_checkpoint; throws std::runtime_error("<what is wrong>") for
/// bytes that are truncated, damaged or not a checkpoint.
TrainingCheckpoint decode_checkpoint(const std::string& bytes);

/// \brief Collective. Every rank writes `mine` to PREFIX.rank<R>.tmp; once all succeeded, each
/// renames its file over PREFIX.rank<R>. If any rank fails, every rank removes its temporary
/// file and throws the same std::runtime_error naming the first failing rank; the previous
/// checkpoint stays as it was.
void save_checkpoint(const Communicator& comm, const std::string& prefix,
                     const TrainingCheckpoint& mine);

/// \brief Collective. Every rank reads PREFIX.rank<R> and checks that it belongs to this rank
/// and P and that its settings equal `expected`, and the ranks check that their files are of
/// the same step. `implied` gives the value of a setting for checkpoints written before it was
/// recorded (and for runs that do not record it). Any problem throws the same std::runtime_error
/// on every rank, naming the first rank that found one.
TrainingCheckpoint load_checkpoint(
    const Communicator& comm, const std::string& prefix,
    const std::vector<std::pair<std::string, std::string>>& expected,
    const std::vector<std::pair<std::string, std::string>>& implied = {});

}  // namespace oktopk::train

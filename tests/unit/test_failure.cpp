// SPDX-License-Identifier: BSD-3-Clause
// How a rank words the cause of a failure before the ranks agree on it or the job ends.
#include <oktopk/impl/comm/failure.hpp>

#include <gtest/gtest.h>

#include <new>
#include <stdexcept>
#include <string>

namespace {

using oktopk::impl::failure_cause;
using oktopk::impl::one_line;

// A bad_alloc subclass with its own text, as Kokkos's RawMemoryAllocationFailure is.
struct NamedAllocationFailure : std::bad_alloc {
  const char* what() const noexcept override { return "could not allocate 'x' (64 bytes)"; }
};

TEST(FailureCause, NamesAPlainBadAllocAsOutOfMemory) {
  EXPECT_STREQ(failure_cause(std::bad_alloc()), "out of memory (std::bad_alloc)");
}

TEST(FailureCause, KeepsTheTextOfEveryOtherException) {
  EXPECT_STREQ(failure_cause(NamedAllocationFailure()), "could not allocate 'x' (64 bytes)");
  EXPECT_STREQ(failure_cause(std::runtime_error("Kokkos failed to allocate memory for label "
                                                "\"oktopk::x\"\n\nTraceback\n")),
               "Kokkos failed to allocate memory for label \"oktopk::x\"\n\nTraceback\n");
  EXPECT_STREQ(failure_cause(std::invalid_argument("")), "an exception without a message");
}

TEST(OneLine, TurnsLineBreaksIntoSpacesAndDropsTrailingOnes) {
  EXPECT_EQ(one_line("a\nb\r\nc\n\n"), "a b  c");
  EXPECT_EQ(one_line(""), "");
  EXPECT_EQ(one_line(nullptr), "");
}

TEST(OneLine, CutsAtTheBuffer) {
  const std::string longer(5000, 'x');
  EXPECT_EQ(one_line(longer.c_str()), std::string(1023, 'x'));
}

}  // namespace

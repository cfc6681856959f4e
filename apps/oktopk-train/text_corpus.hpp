// SPDX-License-Identifier: BSD-3-Clause
// The English text the language model of oktopk-train learns: the King James Bible, one verse a
// line as the Debian program `bible -f` prints it (scripts/kjv-corpus.sh), turned into word ids.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace oktopk::train {

/// \brief The words of `text`, lowercased. A word is a run of ASCII letters; an apostrophe
/// between two letters stays inside it ("king's"), every other character (punctuation, digits,
/// spaces, a trailing apostrophe) only separates words and is dropped.
std::vector<std::string> tokenize(std::string_view text);

/// \brief Word ids 0..size()-1: 0 is "<unk>" (every word outside the vocabulary), 1 is "</s>"
/// (the end of a verse), then the most frequent words, most frequent first.
class Vocabulary {
 public:
  static constexpr std::int32_t unknown_id = 0;
  static constexpr std::int32_t end_of_verse_id = 1;

  /// The `size` - 2 most frequent words of `texts` (ties in alphabetical order, so the ids do
  /// not depend on the hash map's order), or all of them when there are fewer. size >= 3.
  static Vocabulary from_texts(const std::vector<std::string>& texts, std::int64_t size);

  std::int64_t size() const { return static_cast<std::int64_t>(words_.size()); }
  /// unknown_id for a word outside the vocabulary.
  std::int32_t id(const std::string& word) const;
  const std::string& word(std::int32_t id) const { return words_.at(static_cast<std::size_t>(id)); }
  /// Each text's word ids followed by end_of_verse_id, all texts in order.
  std::vector<std::int32_t> encode(const std::vector<std::string>& texts) const;

 private:
  std::vector<std::string> words_;
  std::unordered_map<std::string, std::int32_t> ids_;
};

/// \brief The texts of a file of lines "<reference> <text>" (what `bible -f` prints, e.g.
/// "Ge1:1 In the beginning ..."), references dropped. Throws std::runtime_error
/// ("oktopk::train::read_verses: <path>: ...") when the file is missing, unreadable or empty.
std::vector<std::string> read_verses(const std::string& path);

/// \brief Texts split by their position: text i (from 0) is held out for testing when
/// i % test_every == test_every - 1, so the test set samples every book evenly and the two
/// sets never share a verse. test_every >= 2.
struct TextSplit {
  std::vector<std::string> train;
  std::vector<std::string> test;
};
TextSplit split_texts(const std::vector<std::string>& texts, std::int64_t test_every);

/// \brief A corpus ready for training: the vocabulary, built from the training verses alone,
/// and both token streams.
struct TokenCorpus {
  Vocabulary vocabulary;
  std::vector<std::int32_t> train;
  std::vector<std::int32_t> test;
};

/// Every 20th verse is a test verse: about 40,000 test words of the Bible's 790,000.
constexpr std::int64_t default_test_every = 20;

TokenCorpus make_token_corpus(const std::vector<std::string>& texts, std::int64_t vocabulary_size,
                              std::int64_t test_every = default_test_every);

}  // namespace oktopk::train

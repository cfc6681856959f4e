// SPDX-License-Identifier: BSD-3-Clause
#include "text_corpus.hpp"

#include <oktopk/error.hpp>

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <utility>

namespace oktopk::train {

namespace {

bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

}  // namespace

std::vector<std::string> tokenize(std::string_view text) {
  std::vector<std::string> words;
  std::string word;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (is_letter(c)) {
      word.push_back(lower(c));
    } else if (c == '\'' && !word.empty() && i + 1 < text.size() && is_letter(text[i + 1])) {
      word.push_back(c);
    } else if (!word.empty()) {
      words.push_back(std::move(word));
      word.clear();
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

Vocabulary Vocabulary::from_texts(const std::vector<std::string>& texts, std::int64_t size) {
  OKTOPK_REQUIRE(size >= 3, std::invalid_argument, "oktopk::train::Vocabulary::from_texts",
                 "a vocabulary needs at least 3 entries (<unk>, </s> and a word), got " << size);
  std::unordered_map<std::string, std::int64_t> counts;
  for (const auto& text : texts) {
    for (auto& word : tokenize(text)) ++counts[std::move(word)];
  }
  std::vector<std::pair<std::string, std::int64_t>> ranked(counts.begin(), counts.end());
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  const auto kept = std::min<std::size_t>(ranked.size(), static_cast<std::size_t>(size - 2));
  Vocabulary v;
  v.words_ = {"<unk>", "</s>"};
  for (std::size_t i = 0; i < kept; ++i) v.words_.push_back(ranked[i].first);
  for (std::size_t i = 0; i < v.words_.size(); ++i) {
    v.ids_.emplace(v.words_[i], static_cast<std::int32_t>(i));
  }
  return v;
}

std::int32_t Vocabulary::id(const std::string& word) const {
  const auto found = ids_.find(word);
  return found == ids_.end() ? unknown_id : found->second;
}

std::vector<std::int32_t> Vocabulary::encode(const std::vector<std::string>& texts) const {
  std::vector<std::int32_t> ids;
  for (const auto& text : texts) {
    for (const auto& word : tokenize(text)) ids.push_back(id(word));
    ids.push_back(end_of_verse_id);
  }
  return ids;
}

std::vector<std::string> read_verses(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error("oktopk::train::read_verses: " + path +
                             ": missing file (make it with scripts/kjv-corpus.sh " + path +
                             ", which needs the Debian packages bible-kjv and bible-kjv-text)");
  }
  std::vector<std::string> texts;
  std::string line;
  while (std::getline(in, line)) {
    const auto space = line.find(' ');
    if (space == std::string::npos) continue;  // a blank line or a bare reference: no words
    texts.push_back(line.substr(space + 1));
  }
  if (in.bad()) throw std::runtime_error("oktopk::train::read_verses: " + path + ": read error");
  if (texts.empty()) {
    throw std::runtime_error("oktopk::train::read_verses: " + path +
                             ": no verses (expected lines '<reference> <text>')");
  }
  return texts;
}

TextSplit split_texts(const std::vector<std::string>& texts, std::int64_t test_every) {
  OKTOPK_REQUIRE(test_every >= 2, std::invalid_argument, "oktopk::train::split_texts",
                 "test_every must be at least 2, got " << test_every);
  TextSplit split;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const bool test =
        static_cast<std::int64_t>(i % static_cast<std::size_t>(test_every)) == test_every - 1;
    (test ? split.test : split.train).push_back(texts[i]);
  }
  return split;
}

TokenCorpus make_token_corpus(const std::vector<std::string>& texts, std::int64_t vocabulary_size,
                              std::int64_t test_every) {
  const TextSplit split = split_texts(texts, test_every);
  TokenCorpus corpus;
  corpus.vocabulary = Vocabulary::from_texts(split.train, vocabulary_size);
  corpus.train = corpus.vocabulary.encode(split.train);
  corpus.test = corpus.vocabulary.encode(split.test);
  return corpus;
}

}  // namespace oktopk::train

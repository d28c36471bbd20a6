#include "dsv4/synth/demo_tokenizer.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

// Written for this project; any English prose would do. Long enough for ~1000 merges.
const char kTrainingText[] = R"TEXT(The lighthouse stood at the end of a long spit of rock, and the keeper who lived there kept a cat, a kettle and a logbook. Every evening he climbed the hundred and twelve steps to the lamp room, trimmed the wick, polished the lens and wrote the weather in the book: the wind, the sea, the ships that passed and the birds that rested on the rail.
In the winter the storms came from the west. Waves broke over the rocks and threw spray as high as the gallery, and the whole tower hummed like a bell. The cat slept through all of it, curled on the warm stones beside the stove, and only woke when the keeper opened a tin of fish.
One morning in early spring a small boat drifted into the cove. There was nobody in it, only a coil of rope, a lantern without oil and a wooden box with a brass lock. The keeper pulled the boat onto the shingle and carried the box up to the kitchen. He did not open it at once. He made tea, fed the cat and read the weather again, as if the sea might explain itself if he waited long enough.
When he finally opened the box he found letters, dozens of them, tied in bundles with faded ribbon. They were written by a woman to her brother, who had gone to work on the ships that carried timber and grain between the northern ports. She wrote about the harvest, about the price of bread, about the new school in the village and the bridge that the river had taken in the flood. She asked him to come home before the winter, and in the last letter she asked him only to write.
The keeper read every letter twice. Then he opened his logbook and, for the first time in eleven years, wrote something that was not about the weather. He wrote that a boat had come in with the tide, that it carried a box of letters, and that he would try to find the people they belonged to.
It took him most of the summer. The supply ship came every second Tuesday, and each time he gave the captain a note to post and a question to ask in the harbour towns. Nobody remembered the brother. A clerk in the customs house thought the name was familiar, and a fisherman said that a woman with that name had kept bees on the hill above the old mill, but the house had been empty for years.
In September a reply came. The woman was alive; she had moved to the city to live with her daughter, and she had never stopped waiting for news. The keeper wrapped the letters in oilcloth, put them back in the box with a note of his own, and sent it south on the next boat.
The cat watched the boat leave from the top of the wall. The keeper went back up the stairs, lit the lamp, and wrote in the book: wind from the south, sea calm, visibility good, one parcel sent. Then, after a moment, he added a line about the cat, because it seemed unfair to leave her out.
Numbers matter to a keeper. He counts the seconds between flashes, the hours of oil left in the tank, the days until the ship returns. Three flashes every fifteen seconds, a range of twenty miles, a tower forty metres tall: these are the facts that sailors learn by heart, and the keeper repeats them like a prayer when the fog rolls in and the horn has to sound every half minute through the night.
Questions came to him in the long evenings. Why does the sea glow green on some nights? Where do the swallows go when they leave in autumn? How many ships have passed this rock since the first fire was lit on it, long before there was a tower? He wrote the questions down, and sometimes, months later, he wrote an answer beside them, in smaller letters, with the date.
When the lighthouse was finally automated, the keeper packed his books, his kettle and his cat, and moved to a cottage in the village. He still walks to the harbour every morning to look at the weather, and people say that he can tell you the wind before you feel it on your face.
)TEXT";

// GPT-2's reversible byte -> printable character map: printable Latin-1 bytes map to
// themselves, the other 68 bytes to U+0100.. in byte order.
std::vector<std::string> byte_to_unicode() {
  std::vector<int> printable;
  for (int b = '!'; b <= '~'; ++b) printable.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) printable.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) printable.push_back(b);
  std::vector<int> code(256, -1);
  for (int b : printable) code[b] = b;
  int next = 256;
  for (int b = 0; b < 256; ++b)
    if (code[b] < 0) code[b] = next++;
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    const unsigned cp = static_cast<unsigned>(code[b]);
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {  // all code points here are < 0x800: two UTF-8 bytes
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    out[b] = s;
  }
  return out;
}

// Splits the text into pre-tokens roughly as the DeepSeek pre-tokenizer does for plain
// English: an optional leading space + letters, single digits, punctuation runs, and
// whitespace runs. (Merges only need to be plausible; encoding uses the real regexes.)
std::vector<std::string> pre_tokens(const std::string& text) {
  auto is_letter = [](unsigned char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); };
  auto is_space = [](unsigned char ch) { return ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r'; };
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    const bool space = text[j] == ' ' && j + 1 < text.size() && !is_space(text[j + 1]);
    if (space) ++j;
    unsigned char ch = text[j];
    if (is_letter(ch)) {
      while (j < text.size() && is_letter(text[j])) ++j;
    } else if (ch >= '0' && ch <= '9') {
      ++j;
    } else if (is_space(ch)) {
      while (j < text.size() && is_space(text[j])) ++j;
    } else {
      while (j < text.size() && !is_letter(text[j]) && !is_space(text[j]) && !(text[j] >= '0' && text[j] <= '9')) ++j;
    }
    out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

struct Merge {
  std::string left, right;
};

std::vector<Merge> learn_merges(int n_merges, const std::vector<std::string>& b2u) {
  std::map<std::string, int> word_counts;
  for (const std::string& w : pre_tokens(kTrainingText)) ++word_counts[w];
  // Each word as a sequence of token strings (byte characters to start with).
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [w, n] : word_counts) {
    std::vector<std::string> symbols;
    for (unsigned char ch : w) symbols.push_back(b2u[ch]);
    words.emplace_back(std::move(symbols), n);
  }
  std::set<std::string> vocab(b2u.begin(), b2u.end());
  std::set<std::pair<std::string, std::string>> refused;  // would duplicate an existing token
  std::vector<Merge> merges;
  while (static_cast<int>(merges.size()) < n_merges) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (const auto& [symbols, n] : words)
      for (size_t i = 0; i + 1 < symbols.size(); ++i) pairs[{symbols[i], symbols[i + 1]}] += n;
    // Most frequent pair; ties go to the smallest pair (std::map order), so training is
    // deterministic.
    const std::pair<std::string, std::string>* best = nullptr;
    int best_count = 0;
    for (const auto& [pair, n] : pairs) {
      if (n > best_count && !refused.count(pair)) {
        best = &pair;
        best_count = n;
      }
    }
    if (!best) fail("demo tokenizer: the training text yields only {} merges, {} requested", merges.size(), n_merges);
    const std::string joined = best->first + best->second;
    if (vocab.count(joined)) {
      refused.insert(*best);
      continue;
    }
    const Merge m{best->first, best->second};
    vocab.insert(joined);
    merges.push_back(m);
    for (auto& [symbols, n] : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == m.left && symbols[i + 1] == m.right) {
          merged.push_back(joined);
          ++i;
        } else {
          merged.push_back(symbols[i]);
        }
      }
      symbols = std::move(merged);
    }
  }
  return merges;
}

// The 16 DeepSeek V4 special tokens, in id order (the real tokenizer's top ids).
const char* const kSpecialTokens[16] = {
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>",
    "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜",
    "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>", "<｜authority｜>",
    "<｜domain｜>", "<｜title｜>", "<｜extracted_url｜>", "<｜read_url｜>",
};

}  // namespace

const char* demo_training_text() { return kTrainingText; }

std::string demo_tokenizer_json(int n_merges) {
  using Json = nlohmann::ordered_json;
  const std::vector<std::string> b2u = byte_to_unicode();
  const std::vector<Merge> merges = learn_merges(n_merges, b2u);
  const int first_special = 256 + n_merges;

  Json added = Json::array();
  for (int i = 0; i < 16; ++i) {
    added.push_back({{"id", first_special + i}, {"content", kSpecialTokens[i]}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", true}, {"special", true}});
  }
  auto split = [](const char* regex) {
    return Json{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
  };
  Json pre = {{"type", "Sequence"},
              {"pretokenizers",
               {split("\\p{N}{1,3}"), split("[一-龥぀-ゟ゠-ヿ]+"),
                split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
                      "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[b2u[b]] = b;
  Json merge_list = Json::array();
  for (size_t i = 0; i < merges.size(); ++i) {
    vocab[merges[i].left + merges[i].right] = 256 + static_cast<int>(i);
    merge_list.push_back(merges[i].left + " " + merges[i].right);
  }
  Json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merge_list}};
  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", Json::array()}};
  j["pre_tokenizer"] = pre;
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = model;
  return j.dump(2) + "\n";
}

std::string demo_tokenizer_config_json() {
  using Json = nlohmann::ordered_json;
  auto token = [](const char* content) {
    return Json{{"__type", "AddedToken"}, {"content", content}, {"lstrip", false}, {"normalized", true},
                {"rstrip", false},        {"single_word", false}};
  };
  Json j;
  j["add_bos_token"] = false;
  j["add_eos_token"] = false;
  j["bos_token"] = token(kSpecialTokens[0]);
  j["clean_up_tokenization_spaces"] = false;
  j["eos_token"] = token(kSpecialTokens[1]);
  j["legacy"] = true;
  j["model_max_length"] = 1048576;
  j["pad_token"] = token(kSpecialTokens[1]);
  j["sp_model_kwargs"] = Json::object();
  j["unk_token"] = nullptr;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  return j.dump(2) + "\n";
}

}  // namespace dsv4

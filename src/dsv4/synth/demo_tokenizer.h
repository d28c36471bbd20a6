// A small byte-level BPE tokenizer for the demo checkpoint, in the Hugging Face
// tokenizers format the DeepSeek V4 checkpoints use (same pre-tokenizer, decoder and added
// special tokens as the real tokenizer.json; only the vocabulary is small). Merges are
// learned deterministically from a fixed English text embedded in the source.
#pragma once

#include <string>

namespace dsv4 {

// tokenizer.json for a vocabulary of 256 byte tokens + `merges` learned tokens + the 16
// DeepSeek V4 special tokens at the top ids (bos = vocab-16, eos = vocab-15).
// Throws Error if the training text cannot yield that many merges.
std::string demo_tokenizer_json(int merges);

// tokenizer_config.json as the real V4 file (bos/eos/pad by content, no chat template).
std::string demo_tokenizer_config_json();

// The fixed training text (for tests).
const char* demo_training_text();

}  // namespace dsv4

#include "tokenizer/detokenizer.h"

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace tessera {

namespace {
// How many trailing bytes of the cleaned text a later token can still change.
constexpr size_t kCleanLookahead = 4;
}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tok_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  std::string_view piece = tok_.token_piece(id);  // throws on a bad id
  if (skip_special_ && (tok_.token_attr(id) & (kAttrControl | kAttrUnknown))) piece = {};
  if (first_ && tok_.add_space_prefix() && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
  first_ = false;
  (tok_.clean_spaces() ? raw_ : pending_).append(piece);
  return take(false);
}

std::string IncrementalDetokenizer::flush() { return take(true); }

std::string IncrementalDetokenizer::take(bool final) {
  if (tok_.clean_spaces()) {
    // The clean-up only looks a few bytes ahead, so everything but the tail is settled.
    std::string cleaned = raw_;
    clean_up_spaces(cleaned);
    size_t end = cleaned.size();
    if (!final) end = end > kCleanLookahead ? end - kCleanLookahead : 0;
    if (end <= emitted_clean_) return {};
    std::string_view fresh = std::string_view(cleaned).substr(emitted_clean_, end - emitted_clean_);
    if (!final) fresh.remove_suffix(incomplete_utf8_suffix(fresh));
    emitted_clean_ += fresh.size();
    return sanitize_utf8(fresh);
  }
  const size_t keep = final ? 0 : incomplete_utf8_suffix(pending_);
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

}  // namespace tessera

// fusebox: the paged KV cache's page bookkeeping (no tensors): which pages each request holds,
// reference counts, and the prefix cache that lets requests with the same prompt prefix share
// whole pages. Pure host logic, unit-tested on its own.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <vector>

namespace fusebox {

class KvPool {
 public:
  KvPool(int64_t pages, int64_t page_size);

  struct Seq {
    std::vector<int32_t> pages;  // in position order: page i holds positions [i * page_size, ...)
    int64_t shared = 0;          // leading pages taken from the prefix cache (never written)
  };

  // Reserves pages for a sequence of `prompt` tokens that will grow to `total` tokens: the
  // longest cached run of whole prompt pages is shared (never the page holding the last
  // prompt token: its logits must be computed), the rest freshly allocated. Returns the number
  // of prompt tokens whose K/V are already in the shared pages, or -1 (nothing taken) when the
  // pool cannot hold the sequence now. `share` false: nothing is shared (all pages fresh, 0).
  int64_t admit(Seq* s, const std::vector<int32_t>& prompt, int64_t total, bool share = true);
  // After the prompt's K/V are written: its whole pages become prefix-cache entries.
  void publish(const Seq& s, const std::vector<int32_t>& prompt);
  // Pages admit() would share with `published` once it is published: the whole pages both
  // prompts begin with, short of the page holding `prompt`'s last token.
  int64_t shareable(const std::vector<int32_t>& prompt, const std::vector<int32_t>& published) const;
  // The sequence's pages are given back; cached prefix pages stay cached until reused.
  void release(Seq* s);

  int64_t page_size() const { return page_size_; }
  int64_t pages() const { return static_cast<int64_t>(refs_.size()); }
  int64_t free_pages() const;    // not held by any sequence (cached ones included)
  int64_t cached_pages() const;  // not held, but holding a cached prefix
  // Pages a new sequence of `total` tokens needs beyond what the cache would share.
  int64_t pages_for(int64_t tokens) const { return (tokens + page_size_ - 1) / page_size_; }

 private:
  using Key = uint64_t;  // the hash of a page's tokens and everything before it
  std::vector<Key> keys(const std::vector<int32_t>& prompt, int64_t whole_pages) const;
  int32_t take_free();  // a free page: never cached first, else the least recently released cached one

  int64_t page_size_;
  std::vector<int32_t> refs_;          // by page
  std::vector<int32_t> never_cached_;  // free pages without a prefix (a stack)
  std::list<int32_t> cached_lru_;      // free pages with a prefix, least recently released first
  struct Cached {
    int32_t page;
    std::vector<int32_t> prefix;  // every token up to the page's end: a hash collision never shares
  };
  std::map<Key, Cached> by_key_;   // prefix hash -> page
  std::map<int32_t, Key> key_of_;  // page -> prefix hash
  bool cached_for(const std::vector<Key>& k, const std::vector<int32_t>& prompt, int64_t page) const;
};

}  // namespace fusebox

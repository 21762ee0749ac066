// fusebox: the paged KV cache's page bookkeeping (kv_pool.h).
#include "kv_pool.h"

#include <algorithm>

namespace fusebox {

KvPool::KvPool(int64_t pages, int64_t page_size)
    : page_size_(page_size), refs_(static_cast<size_t>(pages), 0) {
  for (int64_t p = pages - 1; p >= 0; --p) never_cached_.push_back(static_cast<int32_t>(p));
}

std::vector<KvPool::Key> KvPool::keys(const std::vector<int32_t>& prompt, int64_t whole_pages) const {
  std::vector<Key> out;
  Key h = 1469598103934665603ull;  // FNV-1a over the token ids, chained page to page
  for (int64_t p = 0; p < whole_pages; ++p) {
    for (int64_t i = p * page_size_; i < (p + 1) * page_size_; ++i) {
      const uint32_t t = static_cast<uint32_t>(prompt[static_cast<size_t>(i)]);
      for (int b = 0; b < 4; ++b) h = (h ^ ((t >> (8 * b)) & 0xff)) * 1099511628211ull;
    }
    out.push_back(h);
  }
  return out;
}

int32_t KvPool::take_free() {
  if (!never_cached_.empty()) {
    const int32_t p = never_cached_.back();
    never_cached_.pop_back();
    return p;
  }
  const int32_t p = cached_lru_.front();
  cached_lru_.pop_front();
  by_key_.erase(key_of_.at(p));
  key_of_.erase(p);
  return p;
}

bool KvPool::cached_for(const std::vector<Key>& k, const std::vector<int32_t>& prompt, int64_t page) const {
  auto it = by_key_.find(k[static_cast<size_t>(page)]);
  if (it == by_key_.end()) return false;
  const size_t n = static_cast<size_t>((page + 1) * page_size_);
  return it->second.prefix.size() == n &&
         std::equal(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(n),
                    it->second.prefix.begin());
}

int64_t KvPool::admit(Seq* s, const std::vector<int32_t>& prompt, int64_t total, bool share) {
  const int64_t n = static_cast<int64_t>(prompt.size());
  // Shareable: whole pages strictly before the last prompt token's page (none when not sharing).
  const std::vector<Key> k = share ? keys(prompt, (n - 1) / page_size_) : std::vector<Key>{};
  int64_t shared = 0;
  while (shared < static_cast<int64_t>(k.size()) && cached_for(k, prompt, shared)) ++shared;
  const int64_t need = pages_for(total) - shared;
  // Shared pages that are free now (cached, unheld) stop being free when taken.
  int64_t shared_free = 0;
  for (int64_t i = 0; i < shared; ++i)
    shared_free += refs_[static_cast<size_t>(by_key_.at(k[static_cast<size_t>(i)]).page)] == 0;
  if (need > free_pages() - shared_free) return -1;
  s->pages.clear();
  for (int64_t i = 0; i < shared; ++i) {
    const int32_t p = by_key_.at(k[static_cast<size_t>(i)]).page;
    if (refs_[static_cast<size_t>(p)]++ == 0) cached_lru_.remove(p);
    s->pages.push_back(p);
  }
  s->shared = shared;
  for (int64_t i = 0; i < need; ++i) {
    const int32_t p = take_free();
    refs_[static_cast<size_t>(p)] = 1;
    s->pages.push_back(p);
  }
  return shared * page_size_;
}

int64_t KvPool::shareable(const std::vector<int32_t>& prompt, const std::vector<int32_t>& published) const {
  const auto common = static_cast<int64_t>(
      std::mismatch(prompt.begin(), prompt.end(), published.begin(), published.end()).first - prompt.begin());
  const auto n = static_cast<int64_t>(prompt.size());
  return std::min({common, static_cast<int64_t>(published.size()), n > 0 ? n - 1 : 0}) / page_size_;
}

void KvPool::publish(const Seq& s, const std::vector<int32_t>& prompt) {
  const int64_t whole = static_cast<int64_t>(prompt.size()) / page_size_;
  const std::vector<Key> k = keys(prompt, whole);
  for (int64_t i = s.shared; i < whole; ++i) {
    const int32_t p = s.pages[static_cast<size_t>(i)];
    if (by_key_.count(k[static_cast<size_t>(i)]) || key_of_.count(p)) continue;
    by_key_[k[static_cast<size_t>(i)]] =
        Cached{p, std::vector<int32_t>(prompt.begin(),
                                       prompt.begin() + static_cast<std::ptrdiff_t>((i + 1) * page_size_))};
    key_of_[p] = k[static_cast<size_t>(i)];
  }
}

void KvPool::release(Seq* s) {
  for (int32_t p : s->pages) {
    if (--refs_[static_cast<size_t>(p)] > 0) continue;
    if (key_of_.count(p))
      cached_lru_.push_back(p);
    else
      never_cached_.push_back(p);
  }
  s->pages.clear();
  s->shared = 0;
}

int64_t KvPool::free_pages() const { return static_cast<int64_t>(never_cached_.size() + cached_lru_.size()); }
int64_t KvPool::cached_pages() const { return static_cast<int64_t>(cached_lru_.size()); }

}  // namespace fusebox

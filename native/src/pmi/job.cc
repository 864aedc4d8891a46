#include "pmi/job.h"

#include <algorithm>

namespace dpmix::pmi {

namespace {

const std::string *Find(const std::vector<std::pair<std::string, std::string>> &list, std::string_view key) {
  for (const auto &kv : list) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

int64_t Len(std::string_view a, std::string_view b) { return static_cast<int64_t>(a.size() + b.size()); }

}  // namespace

Job::Job(JobSpec spec) : spec_(std::move(spec)) {
  const auto n = static_cast<size_t>(spec_.size);
  staged_.resize(n);
  joins_.assign(n, 0);
  if (spec_.node.size() != n) spec_.node.assign(n, 0);
  if (spec_.local.size() != n) spec_.local.assign(n, false);
  int nodes = 0;
  for (int x : spec_.node) nodes = std::max(nodes, x + 1);
  nodeKv_.resize(static_cast<size_t>(nodes));
}

std::optional<std::string> Job::Charge(int64_t entries, int64_t bytes) {
  const JobLimits &l = spec_.limits;
  if (puts_ >= l.puts) return "job " + spec_.jobId + " has made its limit of " + std::to_string(l.puts) + " puts";
  if (entries_ + entries > l.kvEntries)
    return "job " + spec_.jobId + " holds its limit of " + std::to_string(l.kvEntries) + " keys";
  if (bytes_ + bytes > l.kvBytes) {
    return "job " + spec_.jobId + " would hold more than its limit of " + std::to_string(l.kvBytes) +
           " bytes of keys and values";
  }
  puts_++;
  entries_ += entries;
  bytes_ += bytes;
  return std::nullopt;
}

std::optional<std::string> Job::Set(std::unordered_map<std::string, std::string> &map, std::string_view key,
                                    std::string_view value) {
  auto old = map.find(std::string(key));
  bool fresh = old == map.end();
  if (auto err = Charge(fresh ? 1 : 0, Len(key, value) - (fresh ? 0 : Len(key, old->second)))) return err;
  if (fresh)
    map.emplace(std::string(key), std::string(value));
  else
    old->second.assign(value);
  return std::nullopt;
}

std::optional<std::string> Job::Stage(int rank, std::string_view key, std::string_view value) {
  return Set(staged_[static_cast<size_t>(rank)], key, value);
}

Job::Found Job::Lookup(int rank, std::string_view key, const std::string **value) const {
  std::string k(key);
  const auto &mine = staged_[static_cast<size_t>(rank)];
  if (auto it = mine.find(k); it != mine.end()) {
    *value = &it->second;
    return Found::kYes;
  }
  if (auto it = committed_.find(k); it != committed_.end()) {
    *value = &it->second;
    return Found::kYes;
  }
  for (const auto &s : staged_) {
    if (s.count(k)) return Found::kUnfenced;
  }
  return Found::kUnknown;
}

std::optional<std::string> Job::PutNode(int rank, std::string_view key, std::string_view value,
                                        std::vector<Waiter> *woken) {
  const int node = spec_.node[static_cast<size_t>(rank)];
  if (auto err = Set(nodeKv_[static_cast<size_t>(node)], key, value)) return err;
  auto keep = nodeWaiters_.begin();
  for (auto it = nodeWaiters_.begin(); it != nodeWaiters_.end(); ++it) {
    if (it->first == node && it->second.first == key)
      woken->push_back(std::move(it->second.second));
    else
      *keep++ = std::move(*it);
  }
  nodeWaiters_.erase(keep, nodeWaiters_.end());
  return std::nullopt;
}

const std::string *Job::GetNode(int rank, std::string_view key) const {
  const auto &kv = nodeKv_[static_cast<size_t>(spec_.node[static_cast<size_t>(rank)])];
  auto it = kv.find(std::string(key));
  return it == kv.end() ? nullptr : &it->second;
}

void Job::WaitNode(int rank, std::string_view key, Waiter w) {
  nodeWaiters_.push_back({spec_.node[static_cast<size_t>(rank)], {std::string(key), std::move(w)}});
}

void Job::Drop(int rank) {
  auto &mine = staged_[static_cast<size_t>(rank)];
  for (const auto &kv : mine) {
    entries_--;
    bytes_ -= Len(kv.first, kv.second);
  }
  mine.clear();
}

const std::string *Job::Derived(std::string_view key) const { return Find(spec_.derived, key); }

const std::string *Job::LocalAttr(int rank, std::string_view key) const {
  return spec_.local[static_cast<size_t>(rank)] ? Find(spec_.localAttrs, key) : nullptr;
}

std::optional<std::string> Job::Join(int rank, Waiter w, double now, std::optional<FenceEnd> *ended) {
  if (closed_) return closed_;
  const uint64_t epoch = joins_[static_cast<size_t>(rank)];
  auto it = pending_.find(epoch);
  for (const auto &[r, message] : gone_) {
    // A rank that is gone and has not joined this instance never will.
    if (r != rank && !(it != pending_.end() && it->second.arrived[static_cast<size_t>(r)])) return message;
  }
  joins_[static_cast<size_t>(rank)]++;
  if (it == pending_.end()) {
    Instance inst;
    inst.arrived.assign(static_cast<size_t>(spec_.size), false);
    inst.started = now;
    inst.deadline = spec_.timeoutMs > 0 ? now + static_cast<double>(spec_.timeoutMs) / 1000.0 : 0;
    it = pending_.emplace(epoch, std::move(inst)).first;
  }
  Instance &inst = it->second;
  inst.arrived[static_cast<size_t>(rank)] = true;
  inst.count++;
  w.rank = rank;
  inst.waiters.push_back(std::move(w));
  if (inst.count < spec_.size) return std::nullopt;
  // Complete: every rank's staged puts become everyone's, in the order the ranks joined.
  for (const Waiter &x : inst.waiters) {
    auto &mine = staged_[static_cast<size_t>(x.rank)];
    for (auto &kv : mine) {
      auto old = committed_.find(kv.first);
      if (old != committed_.end()) {
        entries_--;
        bytes_ -= Len(old->first, old->second);
        old->second = std::move(kv.second);
      } else {
        committed_.emplace(kv.first, std::move(kv.second));
      }
    }
    mine.clear();
  }
  FenceEnd end;
  end.waiters = std::move(inst.waiters);
  end.seconds = now - inst.started;
  pending_.erase(it);
  *ended = std::move(end);
  return std::nullopt;
}

FenceEnd Job::Fail(std::map<uint64_t, Instance>::iterator it, std::string error, const char *outcome, double now) {
  FenceEnd end;
  end.waiters = std::move(it->second.waiters);
  end.error = std::move(error);
  end.seconds = now - it->second.started;
  end.outcome = outcome;
  pending_.erase(it);
  return end;
}

std::vector<FenceEnd> Job::RankGone(int rank, const std::string &message, double now) {
  if (rank < 0 || rank >= spec_.size) return {};
  bool known = false;
  for (const auto &g : gone_) known = known || g.first == rank;
  if (!known) gone_.emplace_back(rank, message);
  std::vector<FenceEnd> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto next = std::next(it);
    if (!it->second.arrived[static_cast<size_t>(rank)]) out.push_back(Fail(it, message, "failed", now));
    it = next;
  }
  return out;
}

std::vector<FenceEnd> Job::Close(const std::string &message, double now, std::vector<Waiter> *nodeWaiters) {
  if (!closed_) closed_ = message;
  std::vector<FenceEnd> out;
  while (!pending_.empty()) out.push_back(Fail(pending_.begin(), message, "failed", now));
  for (auto &nw : nodeWaiters_) nodeWaiters->push_back(std::move(nw.second.second));
  nodeWaiters_.clear();
  return out;
}

std::vector<FenceEnd> Job::Expire(double now) {
  std::vector<FenceEnd> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto next = std::next(it);
    const Instance &inst = it->second;
    if (inst.deadline > 0 && inst.deadline <= now) {
      std::string missing;
      for (int r = 0; r < spec_.size; r++) {
        if (inst.arrived[static_cast<size_t>(r)]) continue;
        if (!missing.empty()) missing += ',';
        missing += std::to_string(r);
      }
      out.push_back(Fail(
          it,
          "collective 'fence' timed out after " + std::to_string(spec_.timeoutMs) + " ms waiting for ranks " + missing,
          "timeout", now));
    }
    it = next;
  }
  return out;
}

double Job::NextDeadline() const {
  double best = 0;
  for (const auto &[epoch, inst] : pending_) {
    if (inst.deadline > 0 && (best == 0 || inst.deadline < best)) best = inst.deadline;
  }
  return best;
}

}  // namespace dpmix::pmi

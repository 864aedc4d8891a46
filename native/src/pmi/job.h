// One MPICH / Intel MPI job as the native PMI engine serves it: what its ranks may ask about it,
// its key-value space with the budget a broken client cannot exceed, its node attributes, and the
// state of its `fence` collective (PMI-1 barrier, PMI-2 kvs-fence).
//
// The collective's rules are src/rm's (collectives.ts): each rank's n-th join meets the others'
// n-th join; an instance completes when every rank has joined, and fails when a rank that has
// not joined it is gone, when the job ends, or at its deadline. src/rm decides who is gone and
// when the job ends and says so (RankGone, Close, with its own messages); this object applies it
// where the engine's thread reaches it without JavaScript. Puts are staged per rank and become
// everyone's when an instance completes (hydra caches them likewise), all in one step on the
// engine's thread, so no rank sees half an epoch.
//
// Only the engine's thread touches a Job.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dpmix::pmi {

struct JobLimits {
  // Distinct keys held, staged and committed (node attributes included).
  int64_t kvEntries = 65536;
  // Bytes of keys and values held, staged and committed.
  int64_t kvBytes = 32 * 1024 * 1024;
  // Puts over the job's life (overwrites included).
  int64_t puts = 1048576;
};

struct JobSpec {
  std::string jobId;
  std::string kvsname;
  int size = 0;
  int appnum = 0;
  int universeSize = 0;
  // Each rank's node (an index): node attributes are shared per node.
  std::vector<int> node;
  // Job attributes the server derives (PMI_process_mapping, universeSize): answered even after
  // the job ended.
  std::vector<std::pair<std::string, std::string>> derived;
  // Attributes of ranks on the server's host (PMI_hwloc_xmlfile), and which ranks those are.
  std::vector<std::pair<std::string, std::string>> localAttrs;
  std::vector<bool> local;
  JobLimits limits;
  // Deadline of one fence instance from its first join; 0: none.
  int64_t timeoutMs = 0;
};

// Someone waiting in a fence or a node-attribute wait: the connection and how to answer it.
struct Waiter {
  uint64_t conn = 0;
  int rank = -1;
  bool pmi2 = false;
  bool hasThrid = false;
  std::string thrid;
};

// A fence instance that ended: who waited, and the error if it failed.
struct FenceEnd {
  std::vector<Waiter> waiters;
  std::optional<std::string> error;
  double seconds = 0;
  const char *outcome = "ok";  // ok | failed | timeout
};

class Job {
 public:
  explicit Job(JobSpec spec);

  const JobSpec &spec() const { return spec_; }

  // Why the job's ranks get nothing but errors now (ended or released), if they do.
  const std::optional<std::string> &over() const { return released_ ? released_ : closed_; }

  // ---- key-value space ----
  // Stages a put of `rank`: its own at once, everyone's after its next fence. An error message
  // when the budget is spent.
  std::optional<std::string> Stage(int rank, std::string_view key, std::string_view value);
  enum class Found { kYes, kUnknown, kUnfenced };
  // kYes: *value points at the stored value (valid until the job changes).
  Found Lookup(int rank, std::string_view key, const std::string **value) const;
  // A node attribute: visible to the node's ranks at once. Fills `woken` with the waiters it satisfies.
  std::optional<std::string> PutNode(int rank, std::string_view key, std::string_view value,
                                     std::vector<Waiter> *woken);
  const std::string *GetNode(int rank, std::string_view key) const;
  void WaitNode(int rank, std::string_view key, Waiter w);
  // The rank finalized: its staged puts are dropped.
  void Drop(int rank);
  // A job attribute for `rank`: derived ones first, then the local ones.
  const std::string *Derived(std::string_view key) const;
  const std::string *LocalAttr(int rank, std::string_view key) const;

  // ---- the fence collective ----
  // `rank` joins. An error message if it fails at once; otherwise it waits, and `ended` is set
  // when this join completed an instance.
  std::optional<std::string> Join(int rank, Waiter w, double now, std::optional<FenceEnd> *ended);
  // src/rm: `rank` will never join again; instances it owes fail with `message`.
  std::vector<FenceEnd> RankGone(int rank, const std::string &message, double now);
  // src/rm: the job ended; everything pending fails with `message`, and so does everything later.
  // Node-attribute waiters come back in `nodeWaiters`.
  std::vector<FenceEnd> Close(const std::string &message, double now, std::vector<Waiter> *nodeWaiters);
  // The PMI backend let the job go: later commands get `message`.
  void Release(const std::string &message) { released_ = message; }
  // Instances past their deadline fail.
  std::vector<FenceEnd> Expire(double now);
  // The earliest deadline of a pending instance (0: none).
  double NextDeadline() const;

 private:
  struct Instance {
    std::vector<bool> arrived;
    int count = 0;
    std::vector<Waiter> waiters;
    double started = 0;
    double deadline = 0;
  };

  std::optional<std::string> Charge(int64_t entries, int64_t bytes);
  // Puts key = value into `map` within the budget.
  std::optional<std::string> Set(std::unordered_map<std::string, std::string> &map, std::string_view key,
                                 std::string_view value);
  FenceEnd Fail(std::map<uint64_t, Instance>::iterator it, std::string error, const char *outcome, double now);

  JobSpec spec_;
  std::vector<std::unordered_map<std::string, std::string>> staged_;
  std::unordered_map<std::string, std::string> committed_;
  std::vector<std::unordered_map<std::string, std::string>> nodeKv_;
  std::vector<std::pair<int, std::pair<std::string, Waiter>>> nodeWaiters_;  // node, key, waiter
  int64_t entries_ = 0, bytes_ = 0, puts_ = 0;

  std::vector<uint64_t> joins_;                    // per rank: how many times it joined
  std::map<uint64_t, Instance> pending_;           // by epoch
  std::vector<std::pair<int, std::string>> gone_;  // in the order src/rm said so
  std::optional<std::string> closed_;
  std::optional<std::string> released_;
};

}  // namespace dpmix::pmi

#include "common/in_process.h"

#include <unistd.h>

#include <map>

namespace halka {
namespace {

struct Listing {
  absl::Mutex mu;
  std::map<std::string, std::weak_ptr<InProcessWorker>> by_address
      ABSL_GUARDED_BY(mu);
};

// Never destroyed: a worker may close its entry from a static destructor.
Listing& TheListing() {
  static Listing* listing = new Listing();
  return *listing;
}

}  // namespace

std::shared_ptr<InProcessWorker> InProcessWorker::Register(
    const std::string& address, RunFn run) {
  auto w = std::make_shared<InProcessWorker>(std::move(run));
  w->address_ = address;
  w->pid_ = static_cast<int>(getpid());
  Listing& l = TheListing();
  absl::MutexLock lock(&l.mu);
  l.by_address[address] = w;
  return w;
}

std::shared_ptr<InProcessWorker> InProcessWorker::Find(
    const std::string& address) {
  Listing& l = TheListing();
  std::shared_ptr<InProcessWorker> w;
  {
    absl::MutexLock lock(&l.mu);
    auto it = l.by_address.find(address);
    if (it == l.by_address.end()) return nullptr;
    w = it->second.lock();
  }
  if (w == nullptr || w->closed() || w->pid_ != static_cast<int>(getpid())) {
    return nullptr;
  }
  return w;
}

std::optional<absl::Status> InProcessWorker::Run(const v1::RunRequest& req,
                                                 void* data, size_t bytes,
                                                 v1::RunReply* reply) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return std::nullopt;
    ++inside_;
  }
  struct Leave {
    InProcessWorker& w;
    ~Leave() {
      absl::MutexLock lock(&w.mu_);
      --w.inside_;
    }
  } leave{*this};
  return run_(req, data, bytes, reply);
}

void InProcessWorker::Close() {
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  Listing& l = TheListing();
  absl::MutexLock lock(&l.mu);
  auto it = l.by_address.find(address_);
  if (it != l.by_address.end() && it->second.lock().get() == this) {
    l.by_address.erase(it);
  }
}

void InProcessWorker::Drain() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return inside_ == 0;
  };
  mu_.Await(absl::Condition(&idle));
}

bool InProcessWorker::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

}  // namespace halka

// The in-process communicator (backend/comm.h) on CPU backends: uneven all-to-all and
// all-gather against the blocks each rank must end with, inconsistent counts and a failing rank
// reaching every rank with one Status, and a lost rank ending the others' wait at the timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/comm.h"

using namespace zimage;

namespace {

// Runs body(rank, comm, backend) on `p` threads with their own CPU backends; each rank's Status.
// Fails the test (instead of hanging) when the ranks take longer than 20 s.
std::vector<Status> run_ranks(LocalCommGroup& g,
                              const std::function<Status(int, Communicator&, Backend&)>& body) {
  const int p = g.size();
  std::vector<std::unique_ptr<Backend>> be;
  for (int r = 0; r < p; ++r) {
    be.push_back(make_cpu_backend(1));
    g.attach(r, be.back().get());
  }
  std::vector<std::future<Status>> fs;
  for (int r = 0; r < p; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] { return body(r, g.comm(r), *be[r]); }));
  std::vector<Status> out;
  for (auto& f : fs) {
    if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << "a rank hangs";
      std::abort();  // a hung collective cannot be recovered; the test binary must not hang
    }
    out.push_back(f.get());
  }
  return out;
}

// What rank `from` sends to rank `to`: count(from, to) values tagged with both ranks.
int64_t count(int from, int to) {
  return (from * 3 + to * 5) % 4;  // includes empty blocks
}
float value(int from, int to, int64_t k) {
  return static_cast<float>(1000 * from + 100 * to + k);
}

}  // namespace

TEST(LocalComm, AllToAllUnevenCounts) {
  for (int p : {1, 2, 3, 4}) {
    LocalCommGroup g(p);
    auto st = run_ranks(g, [p](int r, Communicator& c, Backend& be) -> Status {
      std::vector<int64_t> sc(p), rc(p);
      int64_t ns = 0, nr = 0;
      for (int j = 0; j < p; ++j) ns += sc[j] = count(r, j), nr += rc[j] = count(j, r);
      ZI_ASSIGN_OR_RETURN(Tensor send, be.alloc(DType::kF32, {ns + 1}));
      ZI_ASSIGN_OR_RETURN(Tensor recv, be.alloc(DType::kF32, {nr + 1}));
      int64_t at = 0;
      for (int j = 0; j < p; ++j)
        for (int64_t k = 0; k < sc[j]; ++k) send.data_as<float>()[at++] = value(r, j, k);
      recv.data_as<float>()[nr] = -7.0f;  // past the counts: untouched
      ZI_TRY(c.all_to_all_v(send, sc, recv, rc));
      at = 0;
      for (int i = 0; i < p; ++i)
        for (int64_t k = 0; k < rc[i]; ++k, ++at)
          if (recv.data_as<float>()[at] != value(i, r, k))
            return InternalError("rank " + std::to_string(r) + ": wrong element " +
                                 std::to_string(at) + " from rank " + std::to_string(i));
      if (recv.data_as<float>()[nr] != -7.0f) return InternalError("wrote past the counts");
      return Status::Ok();
    });
    for (int r = 0; r < p; ++r) EXPECT_TRUE(st[r].ok()) << "P=" << p << ": " << st[r].to_string();
  }
}

TEST(LocalComm, AllGatherUnevenCounts) {
  const std::vector<int64_t> counts{3, 0, 5};
  LocalCommGroup g(3);
  auto st = run_ranks(g, [&](int r, Communicator& c, Backend& be) -> Status {
    ZI_ASSIGN_OR_RETURN(Tensor send, be.alloc(DType::kF32, {8}));
    ZI_ASSIGN_OR_RETURN(Tensor recv, be.alloc(DType::kF32, {8}));
    for (int k = 0; k < 8; ++k) send.data_as<float>()[k] = value(r, 0, k);
    for (int rep = 0; rep < 3; ++rep) {  // the group is reusable
      ZI_TRY(be.fill(recv, -1.0f));
      ZI_TRY(c.all_gather_v(send, recv, counts));
      int64_t at = 0;
      for (int i = 0; i < 3; ++i)
        for (int64_t k = 0; k < counts[i]; ++k, ++at)
          if (recv.data_as<float>()[at] != value(i, 0, k))
            return InternalError("rank " + std::to_string(r) + ": wrong element " +
                                 std::to_string(at));
      ZI_TRY(c.barrier());
    }
    return Status::Ok();
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(st[r].ok()) << st[r].to_string();
}

TEST(LocalComm, MismatchedCountsFailOnEveryRank) {
  LocalCommGroup g(3);
  auto st = run_ranks(g, [](int r, Communicator& c, Backend& be) -> Status {
    ZI_ASSIGN_OR_RETURN(Tensor send, be.alloc(DType::kF32, {16}));
    ZI_ASSIGN_OR_RETURN(Tensor recv, be.alloc(DType::kF32, {16}));
    std::vector<int64_t> sc{2, 2, 2}, rc{2, 2, 2};
    if (r == 1) sc[2] = 3;  // rank 2 expects 2 elements from rank 1
    return c.all_to_all_v(send, sc, recv, rc);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(st[r].code(), ErrorCode::kInvalidArgument) << st[r].to_string();
    EXPECT_NE(st[r].message().find("rank 1 sends 3 elements to rank 2"), std::string::npos)
        << st[r].message();
  }
}

TEST(LocalComm, FailingRankReachesEveryRank) {
  LocalCommGroup g(4);
  auto st = run_ranks(g, [](int r, Communicator& c, Backend& be) -> Status {
    ZI_ASSIGN_OR_RETURN(Tensor send, be.alloc(DType::kF32, {4}));
    ZI_ASSIGN_OR_RETURN(Tensor recv, be.alloc(DType::kF32, {16}));
    ZI_TRY(c.all_gather_v(send, recv, {4, 4, 4, 4}));  // one good collective first
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others are waiting
      const Status bad = DeviceError("rank 2 ran out of luck");
      c.abort(bad);
      return bad;
    }
    ZI_TRY(c.all_gather_v(send, recv, {4, 4, 4, 4}));
    return c.barrier();  // later collectives fail at once too
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(st[r].code(), ErrorCode::kDevice) << st[r].to_string();
    EXPECT_EQ(st[r].message(), "rank 2 ran out of luck");
  }
}

TEST(LocalComm, BadArgumentsOnOneRankReachEveryRank) {
  LocalCommGroup g(2);
  auto st = run_ranks(g, [](int r, Communicator& c, Backend& be) -> Status {
    ZI_ASSIGN_OR_RETURN(Tensor send, be.alloc(DType::kF32, {4}));
    ZI_ASSIGN_OR_RETURN(Tensor recv, be.alloc(r == 0 ? DType::kF32 : DType::kBF16, {8}));
    return c.all_gather_v(send, recv, {4, 4});
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), ErrorCode::kInvalidArgument) << st[r].to_string();
    EXPECT_NE(st[r].message().find("differ in dtype"), std::string::npos) << st[r].message();
  }
}

TEST(LocalComm, LostRankTimesOut) {
  LocalCommGroup g(3, std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  auto st = run_ranks(g, [](int r, Communicator& c, Backend&) -> Status {
    if (r == 1) return Status::Ok();  // never arrives, never aborts
    return c.barrier();
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(st[0].code(), ErrorCode::kDevice) << st[0].to_string();
  EXPECT_EQ(st[2].code(), ErrorCode::kDevice) << st[2].to_string();
  EXPECT_NE(st[0].message().find("waited 300 ms"), std::string::npos) << st[0].message();
  EXPECT_LT(s, 10.0);
}

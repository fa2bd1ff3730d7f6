// Unit tests of the broker's pure parts: the Redis URL parser, the job / result / progress codec
// (through the server's own request parser) and the checks on hiredis replies. The worker loop
// itself is tested end to end against a real redis-server by test_broker.py.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "broker/job_codec.h"
#include "broker/redis_client.h"
#include "broker/redis_url.h"

#if ZIMAGE_WITH_HIREDIS
#include <hiredis/hiredis.h>
#endif

namespace zimage::broker {
namespace {

// ---- URLs ---------------------------------------------------------------------------------------
TEST(BrokerUrl, ParsesEveryPart) {
  auto u = parse_redis_url("redis://127.0.0.1");
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 6379);
  EXPECT_EQ(u->db, 0);
  EXPECT_TRUE(u->password.empty());

  u = parse_redis_url("redis://:s3cr%40t@cache.example-1.internal:7000/5");
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_EQ(u->host, "cache.example-1.internal");
  EXPECT_EQ(u->port, 7000);
  EXPECT_EQ(u->db, 5);
  EXPECT_EQ(u->user, "");
  EXPECT_EQ(u->password, "s3cr@t");
  EXPECT_EQ(redacted(*u), "redis://:***@cache.example-1.internal:7000/5");

  u = parse_redis_url("redis://alice:pw@[::1]:6380/");
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 6380);
  EXPECT_EQ(u->user, "alice");
  EXPECT_EQ(u->password, "pw");
  EXPECT_EQ(redacted(*u), "redis://alice:***@[::1]:6380/0");
}

TEST(BrokerUrl, BadUrlsSayWhatIsWrong) {
  const std::pair<const char*, const char*> cases[] = {
      {"localhost:6379", "must start with redis://"},
      {"rediss://h:6379", "only the redis:// scheme"},
      {"http://h", "only the redis:// scheme"},
      {"redis://", "no host"},
      {"redis://:6379", "no host"},
      {"redis://h:0", "port 0 is outside 1..65535"},
      {"redis://h:65536", "port 65536 is outside 1..65535"},
      {"redis://h:12ab", "port 12ab is outside"},
      {"redis://h:", "empty port"},
      {"redis://h/x", "database 'x'"},
      {"redis://h/-1", "database '-1'"},
      {"redis://secret@h", "credentials must be"},
      {"redis://:@h", "empty password"},
      {"redis://a:b@c@d", "more than one '@'"},
      {"redis://:%4@h", "bad percent escape"},
      {"redis://h h:1", "space or control character"},
      {"redis://h\n:1", "space or control character"},
      {"redis://[::1:6379", "'[' without ']'"},
      {"redis://[::1]x", "not ':port'"},
      {"redis://[zz]:1", "not an IPv6 address"},
      {"redis://h;rm:1", "not allowed in a host name"},
  };
  for (const auto& [text, needle] : cases) {
    auto u = parse_redis_url(text);
    ASSERT_FALSE(u.ok()) << text;
    EXPECT_EQ(u.status().code(), ErrorCode::kInvalidArgument) << text;
    EXPECT_NE(u.status().message().find(needle), std::string::npos)
        << text << " -> " << u.status().message();
    EXPECT_EQ(u.status().message().rfind("redis URL '", 0), 0u) << u.status().message();
  }
}

// ---- the job codec ------------------------------------------------------------------------------
serve::ParseLimits limits() {
  serve::ParseLimits l;
  l.request.size_multiple = 16;
  return l;
}

TEST(BrokerCodec, RequestRoundTripsThroughTheServerParser) {
  GenerateRequest req;
  req.prompts = {"a red fox in snow, \"quoted\" \xC3\xA9"};
  req.negative_prompt = "blurry";
  req.width = 768;
  req.height = 512;
  req.steps = 12;
  req.guidance = 3.25f;
  req.seed = 18446744073709551615ull;  // 2^64 - 1 survives JSON
  req.images_per_prompt = 2;
  auto body = request_json(req);
  ASSERT_TRUE(body.ok()) << body.status().message();
  auto spec = decode_job(*body, limits(), 7);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  ASSERT_EQ(spec->runs.size(), 1u);
  const GenerateRequest& r = spec->runs[0];
  EXPECT_EQ(r.prompts, req.prompts);
  ASSERT_TRUE(r.negative_prompt.has_value());
  EXPECT_EQ(*r.negative_prompt, "blurry");
  EXPECT_EQ(r.width, 768);
  EXPECT_EQ(r.height, 512);
  EXPECT_EQ(r.steps, 12);
  EXPECT_EQ(r.guidance, 3.25f);
  EXPECT_EQ(r.seed, req.seed);
  EXPECT_EQ(r.images_per_prompt, 2);
  EXPECT_FALSE(spec->random_seed);
  EXPECT_EQ(spec->output_format, serve::OutputFormat::kPng);
}

TEST(BrokerCodec, MissingSeedTakesTheOneGiven) {
  auto spec = decode_job(R"({"prompt": "x"})", limits(), seed_from_id("1-0"));
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_TRUE(spec->random_seed);
  EXPECT_EQ(spec->runs[0].seed, seed_from_id("1-0"));
  EXPECT_EQ(seed_from_id("1-0"), seed_from_id("1-0"));
  EXPECT_NE(seed_from_id("1-0"), seed_from_id("1-1"));
}

TEST(BrokerCodec, BadJobsAreClearErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"{", "invalid JSON"},
      {"[]", ""},
      {R"({"prompt": 5})", "prompt: must be a string"},
      {R"({"prompt": "x", "num_inference_steps": 0})", "num_inference_steps: 0 is outside"},
      {R"({"prompt": "x", "size": "1000x1024"})", "multiple of 16"},
      {R"({"prompt": "x", "sizee": "64x64"})", "sizee"},
      {R"({"prompt": "x", "seed": -5})", "seed:"},
      {R"({"prompt": "x", "loras": [{"name": "a"}]})", "loras"},
  };
  for (const auto& [body, needle] : cases) {
    auto spec = decode_job(body, limits(), 0);
    ASSERT_FALSE(spec.ok()) << body;
    EXPECT_EQ(spec.status().code(), ErrorCode::kInvalidArgument) << body;
    EXPECT_NE(spec.status().message().find(needle), std::string::npos)
        << body << " -> " << spec.status().message();
  }
  GenerateRequest two;
  two.prompts = {"a", "b"};
  EXPECT_FALSE(request_json(two).ok());
  GenerateRequest bad_utf8;
  bad_utf8.prompts = {"\xff\xfe"};
  auto j = request_json(bad_utf8);
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("prompt"), std::string::npos);
}

TEST(BrokerCodec, EntryFields) {
  auto r = job_request({{"request", "{}"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "{}");
  r = job_request({{"prompt", "x"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no 'request' field"), std::string::npos);
  r = job_request({{"request", "{}"}, {"request", "{}"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than one"), std::string::npos);
}

TEST(BrokerCodec, ResultRoundTripKeepsBinaryImages) {
  JobResult r;
  r.ok = true;
  r.seed = 12345678901234567890ull;
  r.width = 64;
  r.height = 48;
  r.images = {std::string("\x89PNG\0\r\n\x1a", 8), std::string(1000, '\0')};
  r.timings_json = R"({"total_s":1.5})";
  r.worker = "host:42";
  r.deliveries = 2;
  const Fields f = encode_result(r);
  auto back = decode_result(f);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->ok);
  EXPECT_EQ(back->seed, r.seed);
  EXPECT_EQ(back->width, 64);
  EXPECT_EQ(back->height, 48);
  EXPECT_EQ(back->images, r.images);
  EXPECT_EQ(back->timings_json, r.timings_json);
  EXPECT_EQ(back->worker, "host:42");
  EXPECT_EQ(back->deliveries, 2);

  JobResult e;
  e.error = "prompt: must be a string";
  e.error_code = "invalid_argument";
  back = decode_result(encode_result(e));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_FALSE(back->ok);
  EXPECT_EQ(back->error, e.error);
  EXPECT_EQ(back->error_code, "invalid_argument");
  EXPECT_TRUE(back->images.empty());
}

TEST(BrokerCodec, MalformedResultsAreRefused) {
  JobResult r;
  r.ok = true;
  r.images = {"a", "b"};
  Fields f = encode_result(r);
  auto drop = [](Fields fields, const std::string& name) {
    Fields out;
    for (auto& kv : fields)
      if (kv.first != name) out.push_back(kv);
    return out;
  };
  auto set = [](Fields fields, const std::string& name, const std::string& v) {
    for (auto& kv : fields)
      if (kv.first == name) kv.second = v;
    return fields;
  };
  const std::pair<Fields, const char*> cases[] = {
      {drop(f, "image:1"), "no 'image:1' field"},
      {drop(f, "status"), "no 'status' field"},
      {set(f, "status", "done"), "neither ok nor error"},
      {set(f, "images", "-1"), "not a count"},
      {set(f, "images", "99999"), "not a count"},
      {set(f, "images", "0"), "ok without images"},
      {set(f, "seed", "12x"), "seed '12x'"},
      {set(f, "width", "-3"), "width '-3'"},
      {set(f, "deliveries", "x"), "deliveries 'x'"},
  };
  for (const auto& [fields, needle] : cases) {
    auto back = decode_result(fields);
    ASSERT_FALSE(back.ok()) << needle;
    EXPECT_NE(back.status().message().find(needle), std::string::npos) << back.status().message();
  }
}

TEST(BrokerCodec, ProgressRoundTrip) {
  Progress p;
  p.phase = Phase::kDenoise;
  p.step = 3;
  p.total = 8;
  p.elapsed_s = 0.5;
  auto back = decode_progress(encode_progress(p, "w1"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->phase, Phase::kDenoise);
  EXPECT_EQ(back->step, 3);
  EXPECT_EQ(back->total, 8);
  EXPECT_DOUBLE_EQ(back->elapsed_s, 0.5);
  for (const char* bad :
       {"", "[]", R"({"phase":"dance","step":1,"total":2})",
        R"({"phase":"vae","step":"1","total":2})", R"({"phase":"vae","step":-1,"total":2})"})
    EXPECT_FALSE(decode_progress(bad).ok()) << bad;
  EXPECT_EQ(result_key("zimage", "1-0"), "zimage:result:1-0");
  EXPECT_EQ(progress_key("p", "1-0"), "p:progress:1-0");
  EXPECT_EQ(results_stream("p"), "p:results");
}

// ---- replies ------------------------------------------------------------------------------------
TEST(BrokerReply, CheckedReads) {
  Reply s;
  s.type = Reply::Type::kString;
  s.str = "v";
  Reply i;
  i.type = Reply::Type::kInteger;
  i.integer = 7;
  Reply err;
  err.type = Reply::Type::kError;
  err.str = "WRONGTYPE x";
  EXPECT_EQ(*as_string(s, "a"), "v");
  EXPECT_EQ(*as_integer(i, "a"), 7);
  auto bad = as_string(i, "XADD id");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "XADD id: expected a string reply, got integer");
  bad = as_string(err, "GET");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("WRONGTYPE x"), std::string::npos);
  EXPECT_FALSE(as_integer(s, "n").ok());
  Reply arr;
  arr.type = Reply::Type::kArray;
  arr.elements = {s, s, s};
  EXPECT_TRUE(as_array(arr, 3, "a").ok());
  auto short_arr = as_array(arr, 4, "XPENDING row");
  ASSERT_FALSE(short_arr.ok());
  EXPECT_EQ(short_arr.status().message(), "XPENDING row: expected at least 4 elements, got 3");
  EXPECT_FALSE(as_array(s, 0, "a").ok());
  auto odd = as_pairs(arr, "entry");
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("pairs"), std::string::npos);
  arr.elements = {s, i};
  EXPECT_FALSE(as_pairs(arr, "entry").ok());  // a value that is not a string
  arr.elements = {s, s};
  auto pairs = as_pairs(arr, "entry");
  ASSERT_TRUE(pairs.ok());
  EXPECT_EQ(pairs->size(), 1u);
}

#if ZIMAGE_WITH_HIREDIS
TEST(BrokerReply, ConvertChecksEveryHiredisNode) {
  char text[] = "abc\0def";
  redisReply str{};
  str.type = REDIS_REPLY_STRING;
  str.str = text;
  str.len = 7;
  redisReply num{};
  num.type = REDIS_REPLY_INTEGER;
  num.integer = -42;
  redisReply nil{};
  nil.type = REDIS_REPLY_NIL;
  redisReply* kids[] = {&str, &num, &nil};
  redisReply arr{};
  arr.type = REDIS_REPLY_ARRAY;
  arr.elements = 3;
  arr.element = kids;
  auto r = convert_reply(&arr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->elements.size(), 3u);
  EXPECT_EQ(r->elements[0].str, std::string("abc\0def", 7));  // binary safe
  EXPECT_EQ(r->elements[1].integer, -42);
  EXPECT_TRUE(r->elements[2].is_nil());

  redisReply no_data{};
  no_data.type = REDIS_REPLY_STRING;
  no_data.len = 5;  // and str == nullptr
  auto bad = convert_reply(&no_data);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kFormat);
  EXPECT_NE(bad.status().message().find("string without data"), std::string::npos);

  redisReply* holes[] = {&str, nullptr};
  redisReply holey{};
  holey.type = REDIS_REPLY_ARRAY;
  holey.elements = 2;
  holey.element = holes;
  bad = convert_reply(&holey);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("null node"), std::string::npos);

  redisReply no_elements{};
  no_elements.type = REDIS_REPLY_ARRAY;
  no_elements.elements = 2;
  EXPECT_FALSE(convert_reply(&no_elements).ok());

  redisReply odd{};
  odd.type = 99;
  bad = convert_reply(&odd);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown type 99"), std::string::npos);

  std::vector<redisReply> chain(20);
  std::vector<redisReply*> links(20);
  for (size_t k = 0; k < chain.size(); ++k) {
    chain[k] = redisReply{};
    chain[k].type = REDIS_REPLY_ARRAY;
    links[k] = &chain[k];
    if (k + 1 < chain.size()) {
      chain[k].elements = 1;
      chain[k].element = &links[k + 1];
    }
  }
  bad = convert_reply(&chain[0]);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("deeper than 16"), std::string::npos);
  EXPECT_FALSE(convert_reply(nullptr).ok());
}

TEST(BrokerClient, UnreachableServerIsAnIoErrorNamingIt) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);  // a port nobody listens on
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  close(fd);
  RedisUrl url;
  url.port = port;
  url.password = "hidden";
  ClientOptions o;
  o.reconnect_attempts = 2;
  o.backoff_initial_s = 0.01;
  auto c = RedisClient::connect(url, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kIo);
  EXPECT_NE(c.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("cannot connect"), std::string::npos);
  EXPECT_EQ(c.status().message().find("hidden"), std::string::npos);  // never the password
}
#endif

}  // namespace
}  // namespace zimage::broker

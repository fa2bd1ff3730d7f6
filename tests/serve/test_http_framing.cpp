// The transport's request reading without sockets (serve/http/framing.h, multipart.h): the
// same parser and checks as the server, over bytes in memory. Table-driven: each malformed or
// hostile request gets its status and names its field; well-formed ones (Content-Length,
// chunked, multipart) come out as sent.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serve/http/framing.h"
#include "serve/http/multipart.h"

namespace zimage::serve::http {
namespace {

const FramingLimits kLimits{};

TEST(HttpFraming, RefusedHeads) {
  struct Case {
    const char* what;
    std::string bytes;
    int status;
    const char* param;
  };
  std::string many = "GET / HTTP/1.1\r\nHost: a\r\n";
  for (int i = 0; i < 101; ++i) many += "X: y\r\n";
  const std::vector<Case> cases = {
      {"space before colon", "GET / HTTP/1.1\r\nHost : evil\r\n\r\n", 400, "headers"},
      {"two hosts", "GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", 400, "Host"},
      {"no host", "GET / HTTP/1.1\r\n\r\n", 400, "Host"},
      {"different lengths",
       "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400,
       "Content-Length"},
      {"equal lengths",
       "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na", 400,
       "Content-Length"},
      {"length list", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 2\r\n\r\nab", 400,
       "Content-Length"},
      {"negative length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400,
       "Content-Length"},
      {"te and cl",
       "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400,
       "Content-Length"},
      {"te gzip", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 400,
       "Transfer-Encoding"},
      {"gzip body",
       "POST / HTTP/1.1\r\nHost: a\r\nContent-Encoding: gzip\r\nContent-Length: 0\r\n\r\n", 415,
       "Content-Encoding"},
      {"br body", "POST / HTTP/1.1\r\nHost: a\r\ncontent-encoding: br\r\nContent-Length: 0\r\n\r\n",
       415, "Content-Encoding"},
      {"expect other", "POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nContent-Length: 0\r\n\r\n",
       417, "Expect"},
      {"absolute target", "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", 400, "target"},
      {"asterisk target", "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", 400, "target"},
      {"101 fields", many + "\r\n", 431, "headers"},
      {"long path", "GET /v1/jobs/" + std::string(3000, 'a') + " HTTP/1.1\r\nHost: a\r\n\r\n", 414,
       "target"},
      {"long query", "GET /?" + std::string(9000, 'a') + " HTTP/1.1\r\nHost: a\r\n\r\n", 414,
       "target"},
      {"huge head", "GET / HTTP/1.1\r\nHost: a\r\nX: " + std::string(40000, 'a') + "\r\n\r\n", 431,
       "headers"},
      {"bad chunk", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
       "body"},
      {"chunked past limit",
       "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" +
           std::string(1024, 'a') + "\r\n400\r\n" + std::string(1024, 'a') + "\r\n0\r\n\r\n",
       413, "body"},
      {"length past limit", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\n\r\n", 413,
       "body"},
      {"bytes end early", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc", 400,
       "request"},
      {"not http", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "request"},
      {"bad multipart",
       "POST / HTTP/1.1\r\nHost: a\r\nContent-Type: multipart/form-data; "
       "boundary=XX\r\nContent-Length: 5\r\n\r\nhello",
       400, "body"},
  };
  for (const Case& c : cases) {
    const ParsedRequest p = parse_request(c.bytes, 1500, kLimits);
    ASSERT_TRUE(p.error.has_value()) << c.what;
    EXPECT_EQ(p.error->status, c.status) << c.what << ": " << p.error->message;
    EXPECT_EQ(p.error->param, c.param) << c.what << ": " << p.error->message;
    EXPECT_EQ(p.error->message.rfind(c.param, 0), 0u) << c.what << ": " << p.error->message;
  }
}

TEST(HttpFraming, WellFormedRequests) {
  {
    const ParsedRequest p = parse_request(
        "POST /v1/jobs/%61b?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Encoding: "
        "identity\r\n\r\nhello",
        100, kLimits);
    ASSERT_FALSE(p.error) << p.error->message;
    EXPECT_EQ(p.request.method, "POST");
    EXPECT_EQ(p.request.path, "/v1/jobs/ab");
    EXPECT_EQ(p.request.query, "x=1");
    EXPECT_EQ(p.request.body, "hello");
    EXPECT_EQ(p.request.get_header_value("host"), "h");
  }
  {
    const ParsedRequest p = parse_request(
        "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: "
        "chunked\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n",
        100, kLimits);
    ASSERT_FALSE(p.error) << p.error->message;
    EXPECT_EQ(p.request.body, "abcde");
  }
  {  // HTTP/1.0 needs no Host
    const ParsedRequest p = parse_request("GET /healthz HTTP/1.0\r\n\r\n", 0, kLimits);
    ASSERT_FALSE(p.error) << p.error->message;
    EXPECT_EQ(p.request.version, 10);
  }
}

std::string form(const std::string& boundary, const std::vector<std::string>& parts) {
  std::string b;
  for (const auto& p : parts) b += "--" + boundary + "\r\n" + p + "\r\n";
  return b + "--" + boundary + "--\r\n";
}

TEST(HttpMultipart, Parts) {
  const std::string body =
      form("b0undary",
           {"Content-Disposition: form-data; name=\"image\"; filename=\"a \\\"q\\\".png\"\r\n"
            "Content-Type: image/png\r\n\r\n\x89PNG\r\n--b0und",
            "content-disposition: form-data; name=prompt\r\n\r\na fox",
            "Content-Disposition: form-data; name=\"empty\"\r\n\r\n"});
  auto parts = parse_multipart(body, "b0undary");
  ASSERT_TRUE(parts.ok()) << parts.status().message();
  ASSERT_EQ(parts->size(), 3u);
  EXPECT_EQ((*parts)[0].first, "image");
  EXPECT_EQ((*parts)[0].second.filename, "a \"q\".png");
  EXPECT_EQ((*parts)[0].second.content_type, "image/png");
  EXPECT_EQ((*parts)[0].second.content, "\x89PNG\r\n--b0und");  // a near-boundary stays data
  EXPECT_EQ((*parts)[1].first, "prompt");
  EXPECT_EQ((*parts)[1].second.content, "a fox");
  EXPECT_EQ((*parts)[2].second.content, "");
  EXPECT_EQ(multipart_boundary("multipart/form-data; boundary=\"a b\""), "a b");
  EXPECT_EQ(multipart_boundary("multipart/form-data; charset=x; boundary=zz"), "zz");
  EXPECT_EQ(multipart_boundary("multipart/form-data"), "");
  EXPECT_EQ(multipart_boundary("multipart/form-data; boundary=" + std::string(71, 'a')), "");
}

TEST(HttpMultipart, MalformedBodies) {
  const std::string ok_part = "Content-Disposition: form-data; name=\"a\"\r\n\r\nx";
  std::vector<std::string> many(65, ok_part);
  const std::vector<std::pair<const char*, std::string>> cases = {
      {"no boundary line", "hello"},
      {"unterminated part", "--B\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nxyz"},
      {"headers never end", "--B\r\nContent-Disposition: form-data; name=\"a\"\r\n"},
      {"no name", form("B", {"Content-Disposition: form-data; filename=\"f\"\r\n\r\nx"})},
      {"not form-data", form("B", {"Content-Disposition: attachment; name=\"a\"\r\n\r\nx"})},
      {"unclosed quote", form("B", {"Content-Disposition: form-data; name=\"a\r\n\r\nx"})},
      {"header without colon", form("B", {"Bogus\r\n\r\nx"})},
      {"too many parts", form("B", many)},
      {"huge part header", form("B", {"X: " + std::string(9000, 'a') + "\r\n" + ok_part})},
      {"no CRLF after boundary", "--Bxx"},
  };
  for (const auto& [what, body] : cases) {
    auto parts = parse_multipart(body, "B");
    EXPECT_FALSE(parts.ok()) << what;
    if (!parts.ok()) {
      EXPECT_EQ(parts.status().message().rfind("body: malformed multipart/form-data", 0), 0u)
          << what << ": " << parts.status().message();
    }
  }
  EXPECT_FALSE(parse_multipart("--\r\n", "").ok());
}

}  // namespace
}  // namespace zimage::serve::http

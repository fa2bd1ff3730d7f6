#include "common/npy.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace zimage::test {

Result<Tensor> load_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError("cannot open " + path);
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    return FormatError(path + ": not .npy");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t h16;
    f.read(reinterpret_cast<char*>(&h16), 2);
    hlen = h16;
  } else {
    f.read(reinterpret_cast<char*>(&hlen), 4);
  }
  std::string header(hlen, '\0');
  if (!f.read(header.data(), hlen)) return FormatError(path + ": truncated header");
  auto field = [&](const std::string& key) -> std::string {
    auto p = header.find("'" + key + "'");
    if (p == std::string::npos) return "";
    p = header.find(':', p);
    return header.substr(p + 1);
  };
  std::string descr = field("descr");
  auto q1 = descr.find('\'');
  auto q2 = descr.find('\'', q1 + 1);
  descr = descr.substr(q1 + 1, q2 - q1 - 1);
  if (field("fortran_order").find("True") < field("fortran_order").find(','))
    return Unsupported(path + ": fortran order");
  std::string shp = field("shape");
  shp = shp.substr(shp.find('(') + 1, shp.find(')') - shp.find('(') - 1);
  Shape shape;
  std::stringstream ss(shp);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok.find_first_of("0123456789") == std::string::npos) continue;
    shape.push_back(std::stoll(tok));
  }
  DType dt;
  bool f64 = false;
  if (descr == "<f4")
    dt = DType::kF32;
  else if (descr == "<f8") {
    dt = DType::kF32;
    f64 = true;
  } else if (descr == "<i4")
    dt = DType::kI32;
  else if (descr == "<i8")
    dt = DType::kI64;
  else if (descr == "|u1")
    dt = DType::kU8;
  else
    return Unsupported(path + ": dtype " + descr);
  Tensor t = Tensor::host(dt, shape);
  if (f64) {
    std::vector<double> tmp(t.numel());
    if (!f.read(reinterpret_cast<char*>(tmp.data()), tmp.size() * 8))
      return FormatError(path + ": short");
    for (size_t i = 0; i < tmp.size(); ++i) t.data_as<float>()[i] = static_cast<float>(tmp[i]);
  } else if (!f.read(static_cast<char*>(t.data()), t.nbytes())) {
    return FormatError(path + ": truncated data");
  }
  return t;
}

Status save_npy(const std::string& path, const Tensor& t) {
  std::ofstream f(path, std::ios::binary);
  if (!f) return IoError("cannot write " + path);
  std::string shape = "(";
  for (auto d : t.shape()) shape += std::to_string(d) + ",";
  shape += ")";
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  f.write("\x93NUMPY\x01\x00", 8);
  uint16_t hl = static_cast<uint16_t>(h.size());
  f.write(reinterpret_cast<char*>(&hl), 2);
  f.write(h.data(), h.size());
  std::vector<float> tmp(t.numel());
  convert_to_f32(t.dtype(), t.data(), tmp.data(), tmp.size());
  f.write(reinterpret_cast<char*>(tmp.data()), tmp.size() * 4);
  return Status::Ok();
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return INFINITY;  // never "close": a test's `<= tol` fails
  std::vector<float> x(a.numel()), y(b.numel());
  convert_to_f32(a.dtype(), a.data(), x.data(), x.size());
  convert_to_f32(b.dtype(), b.data(), y.data(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double d = std::fabs(static_cast<double>(x[i]) - y[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

std::string golden_dir(const std::string& name) {
  return std::string(ZIMAGE_GOLDEN_DIR) + "/" + name;
}

}  // namespace zimage::test

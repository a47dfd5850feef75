#include "h5io.h"

#include <H5Cpp.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>

#include "version.h"

namespace mhc {
namespace {

// HDF5 16-bit float with bf16 layout: sign 15, exponent 7..14 (bias 127), mantissa 0..6.
H5::FloatType bf16_type() {
  H5::FloatType t(H5::PredType::IEEE_F32LE);
  t.setFields(15, 7, 8, 0, 7);
  t.setPrecision(16);
  t.setSize(2);
  t.setEbias(127);
  return t;
}

bool is_bf16(const H5::FloatType& ft) {
  if (ft.getSize() != 2) return false;
  size_t spos, epos, esize, mpos, msize;
  ft.getFields(spos, epos, esize, mpos, msize);
  return spos == 15 && epos == 7 && esize == 8 && mpos == 0 && msize == 7 && ft.getEbias() == 127;
}

H5::DataType mem_type(DType t) {
  switch (t) {
    case DType::bf16: return bf16_type();
    case DType::f32: return H5::PredType::NATIVE_FLOAT;
    case DType::f64: return H5::PredType::NATIVE_DOUBLE;
  }
  return H5::PredType::NATIVE_DOUBLE;
}

bool link_exists(const H5::H5File& f, const std::string& path) {
  // check every component: H5Lexists fails on a missing intermediate group
  for (size_t pos = path.find('/', 1);; pos = path.find('/', pos + 1)) {
    std::string prefix = path.substr(0, pos);
    if (H5Lexists(f.getId(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (pos == std::string::npos) return true;
  }
}

const char* class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    default: return "non-numeric";
  }
}

Shape dataset_shape(const H5::DataSet& ds) {
  H5::DataSpace sp = ds.getSpace();
  int rank = sp.getSimpleExtentNdims();
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank) sp.getSimpleExtentDims(dims.data());
  return Shape(dims.begin(), dims.end());
}

// The HDF5 float type's name: bfloat16, float16 (IEEE half), float32, float64, or floatN.
std::string float_type_name(const H5::FloatType& ft) {
  if (is_bf16(ft)) return "bfloat16";
  return cat("float", ft.getSize() * 8);
}

// Reads a float dataset keeping bf16/float32/float64; other float formats come as float64,
// their type's name in *stored when given.
Tensor read_float(const H5::H5File& f, const std::string& file, const std::string& path, std::string* stored = nullptr) {
  H5::DataSet ds = f.openDataSet(path);
  if (ds.getTypeClass() != H5T_FLOAT)
    fail(file, ": ", path, ": expected a floating-point dataset, found ", class_name(ds.getTypeClass()));
  H5::FloatType ft = ds.getFloatType();
  std::string name = float_type_name(ft);
  DType dt = name == "bfloat16" ? DType::bf16 : name == "float32" ? DType::f32 : DType::f64;
  if (stored && name != "bfloat16" && name != "float32" && name != "float64") *stored = name;
  Tensor t(dataset_shape(ds), dt);
  if (t.size()) ds.read(t.bytes.data(), mem_type(dt));
  return t;
}

// Every dataset's path in the file ("/forward/h_mix"); a failed walk is an error, never "empty".
std::vector<std::string> dataset_paths(const H5::H5File& f, const std::string& file) {
  std::vector<std::string> names;
  auto visit = [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(data)->push_back(cat("/", name));
    return 0;
  };
  if (H5Ovisit(f.getId(), H5_INDEX_NAME, H5_ITER_NATIVE, visit, &names) < 0)
    fail(file, ": cannot list the file's datasets (corrupt group or link?)");
  return names;
}

// Rounds an input to the dtype the stage table gives it, counting what changed.
Tensor to_input_dtype(const Tensor& raw, DType want, const std::string& where, const LoadOptions& opt) {
  Tensor t = convert(raw, want);
  int64_t inexact = 0, nan = 0, inf = 0;
  for (int64_t i = 0; i < t.size(); ++i) {
    double a = raw.at(i), b = t.at(i);
    if (a != b && !(std::isnan(a) && std::isnan(b))) ++inexact;
    nan += std::isnan(b);
    inf += std::isinf(b);
  }
  if (inexact && opt.strict)
    fail(where, inexact, " of ", t.size(), " values are not exactly representable in ", dtype_name(want),
         " (--strict)");
  if (inexact && !opt.quiet)
    std::cerr << "mhc: warning: " << where << inexact << " of " << t.size() << " values rounded to "
              << dtype_name(want) << " (nearest even)\n";
  if ((nan || inf) && !opt.allow_nonfinite)
    fail(where, nan, " NaN and ", inf, " Inf values (use --allow-nonfinite to accept them)");
  return t;
}

double read_eps(const H5::Group& g, const char* name, double dflt, const std::string& where) {
  if (!g.attrExists(name)) return dflt;
  double v = 0;
  g.openAttribute(name).read(H5::PredType::NATIVE_DOUBLE, &v);
  if (!std::isfinite(v) || v < 0) fail(where, "attribute ", name, " = ", v, ": expected a finite value >= 0");
  return v;
}

void load_inputs(const H5::H5File& f, const std::string& file, const LoadOptions& opt, Case& c) {
  if (!link_exists(f, "/inputs"))
    fail(file, ": /inputs: missing group (expected an mhc case; see docs/schema.md)");
  auto where = [&](const Stage& s) { return cat(file, ": ", dataset_path(s), ": "); };

  const Stage& xs = stage("x");
  if (!link_exists(f, dataset_path(xs))) fail(where(xs), "missing dataset (expected bfloat16 [T,n,D] or [B,S,n,D])");
  Tensor x = read_float(f, file, dataset_path(xs));
  if (x.shape.size() != 3 && x.shape.size() != 4)
    fail(where(xs), "expected rank 3 [T,n,D] or 4 [B,S,n,D], found ", shape_str(x.shape));
  if (x.size() == 0) fail(where(xs), "zero-size dimension in ", shape_str(x.shape));
  c.prob.tokens.assign(x.shape.begin(), x.shape.end() - 2);
  c.prob.n = x.shape[x.shape.size() - 2];
  c.prob.D = x.shape.back();

  for (const Stage& s : stage_table()) {
    if (s.group != Group::inputs) continue;
    Shape want = stage_shape(s, c.prob);
    if (!link_exists(f, dataset_path(s))) {
      if (s.name == std::string("gamma")) {
        Tensor ones(want, DType::f32);
        for (int64_t i = 0; i < ones.size(); ++i) ones.data<float>()[i] = 1.0f;
        c.t["gamma"] = std::move(ones);
      } else if (!is_gradient_input(s.name)) {
        fail(where(s), "missing dataset (expected ", dtype_name(s.dtype), " ", stage_shape_str(s), " = ",
             shape_str(want), ")");
      }
      continue;
    }
    Tensor raw = s.name == std::string("x") ? x : read_float(f, file, dataset_path(s));
    if (raw.shape != want) {
      std::string hint = s.name == std::string("phi") && raw.shape.size() == 2 && raw.shape[1] != c.prob.K()
                             ? cat("; x gives n*D = ", c.prob.K(), " but phi has ", raw.shape[1], " columns")
                             : "";
      fail(where(s), "expected shape ", stage_shape_str(s), " = ", shape_str(want), " (n=", c.prob.n,
           ", D=", c.prob.D, " from /inputs/x), found ", shape_str(raw.shape), hint);
    }
    c.t[s.name] = to_input_dtype(raw, s.dtype, where(s), opt);
  }

  int grads = 0;
  for (auto& g : gradient_inputs()) grads += c.has(g);
  if (grads != 0 && grads != 3)
    fail(file, ": /inputs: ", grads, " of the 3 gradients dh_in, dh_post, dh_res present: backward needs all three",
         " (or none, for forward only)");

  H5::Group g = f.openGroup("/inputs");
  std::string gw = cat(file, ": /inputs: ");
  c.prob.norm_eps = read_eps(g, "norm_eps", 1e-6, gw);
  c.prob.hc_eps = read_eps(g, "hc_eps", 1e-6, gw);
}

// The producer's string attributes on the root group (producer, version, backend, ...).
std::map<std::string, std::string> read_root_attrs(const H5::H5File& f) {
  std::map<std::string, std::string> attrs;
  for (const char* key : {"producer", "version", "backend", "precision", "device"}) {
    if (!f.attrExists(key)) continue;
    H5::Attribute a = f.openAttribute(key);
    if (a.getTypeClass() != H5T_STRING) continue;
    std::string v;
    a.read(a.getStrType(), v);
    attrs[key] = v;
  }
  return attrs;
}

void load_outputs(const H5::H5File& f, const std::string& file, Case& c) {
  for (const std::string& path : dataset_paths(f, file)) {
    std::string group = path.substr(0, path.rfind('/'));
    const Stage* s = find_stage(path.substr(path.rfind('/') + 1));
    if (s && path == dataset_path(*s)) {
      if (s->group == Group::inputs) continue;
      std::string stored;
      c.t[s->name] = read_float(f, file, path, &stored);
      if (!stored.empty()) c.stored_as[s->name] = stored;
    } else if (group.empty() || group == "/inputs" || group == "/forward" || group == "/backward") {
      c.unknown.push_back(path);  // other groups are the user's own
    }
  }
  c.attrs = read_root_attrs(f);
}

std::string parent_dir(const std::string& path) {
  auto pos = path.rfind('/');
  return pos == std::string::npos ? "." : pos == 0 ? "/" : path.substr(0, pos);
}

std::string temp_path(const std::string& path) {
  auto pos = path.rfind('/');
  std::string base = pos == std::string::npos ? path : path.substr(pos + 1);
  return cat(parent_dir(path), "/.", base, ".tmp", getpid());
}

H5::H5File open_h5(const std::string& path) {
  H5::Exception::dontPrint();
  struct stat st;
  if (stat(path.c_str(), &st) != 0) fail(path, ": cannot open: ", std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail(path, ": is a directory, expected an HDF5 file");
  if (H5Fis_hdf5(path.c_str()) <= 0) fail(path, ": not an HDF5 file");
  try {
    return H5::H5File(path, H5F_ACC_RDONLY);
  } catch (const H5::Exception&) {
    fail(path, ": cannot open as HDF5 (truncated or corrupt file?)");
  }
}

void write_str_attr(H5::H5Object& o, const std::string& key, const std::string& value) {
  H5::StrType st(H5::PredType::C_S1, value.size() ? value.size() : 1);
  o.createAttribute(key, st, H5::DataSpace(H5S_SCALAR)).write(st, value);
}

}  // namespace

Case load_case(const std::string& path, const LoadOptions& opt, bool outputs) {
  H5::H5File f = open_h5(path);
  Case c;
  try {
    load_inputs(f, path, opt, c);
    if (outputs) load_outputs(f, path, c);
  } catch (const H5::Exception& e) {
    fail(path, ": read error in ", e.getFuncName(), " (truncated or corrupt file?)");
  }
  return c;
}

void check_output_path(const std::string& out, const std::string& in, bool force) {
  struct stat so, si;
  if (stat(out.c_str(), &so) == 0) {
    if (!in.empty() && stat(in.c_str(), &si) == 0 && so.st_dev == si.st_dev && so.st_ino == si.st_ino)
      fail(out, ": output is the input file; refusing to overwrite it");
    if (S_ISDIR(so.st_mode)) fail(out, ": is a directory, expected an output file name");
    if (!force) fail(out, ": exists (use --force to replace it)");
  }
  std::string dir = parent_dir(out);
  struct stat sd;
  if (stat(dir.c_str(), &sd) != 0 || !S_ISDIR(sd.st_mode)) fail(out, ": directory ", dir, " does not exist");
  std::string probe = temp_path(out);
  int fd = open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
  if (fd < 0) fail(out, ": cannot create files in ", dir, ": ", std::strerror(errno));
  close(fd);
  unlink(probe.c_str());
}

namespace {

void write_dataset(H5::H5File& f, const std::string& path, const Tensor& t) {
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  H5::DataSpace sp(int(dims.size()), dims.data());
  H5::DataType ft = t.dtype == DType::bf16  ? H5::DataType(bf16_type())
                    : t.dtype == DType::f32 ? H5::DataType(H5::PredType::IEEE_F32LE)
                                            : H5::DataType(H5::PredType::IEEE_F64LE);
  H5::LinkCreatPropList lcpl;
  lcpl.setCreateIntermediateGroup(true);
  H5::DataSet ds = f.createDataSet(path, ft, sp, H5::DSetCreatPropList::DEFAULT, H5::DSetAccPropList::DEFAULT, lcpl);
  if (t.size()) ds.write(t.bytes.data(), mem_type(t.dtype));
}

// Writes a new file through `fill` into a temporary file beside `path`, then renames it
// into place: no partial output survives a failure.
void write_atomically(const std::string& path, const std::function<void(H5::H5File&)>& fill) {
  H5::Exception::dontPrint();
  std::string tmp = temp_path(path);
  try {
    H5::H5File f(tmp, H5F_ACC_TRUNC);
    write_str_attr(f, "producer", "mhc");
    write_str_attr(f, "version", MHC_VERSION);
    fill(f);
    f.close();
  } catch (const H5::Exception& e) {
    unlink(tmp.c_str());
    fail(path, ": cannot write (", e.getFuncName(), ")");
  } catch (...) {
    unlink(tmp.c_str());
    throw;
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    fail(path, ": cannot rename temporary file into place: ", std::strerror(err));
  }
}

}  // namespace

void save_case(const std::string& path, const Case& c) {
  write_atomically(path, [&](H5::H5File& f) {
    for (auto& [k, v] : c.attrs)
      if (k != "producer" && k != "version") write_str_attr(f, k, v);
    int schema = MHC_SCHEMA_VERSION;
    f.createAttribute("schema_version", H5::PredType::STD_I32LE, H5::DataSpace(H5S_SCALAR))
        .write(H5::PredType::NATIVE_INT, &schema);
    for (Group grp : {Group::inputs, Group::forward, Group::backward}) {
      H5::Group g = f.createGroup(cat("/", group_name(grp)));
      if (grp == Group::inputs)
        for (auto [key, v] : {std::pair{"norm_eps", c.prob.norm_eps}, std::pair{"hc_eps", c.prob.hc_eps}})
          g.createAttribute(key, H5::PredType::IEEE_F64LE, H5::DataSpace(H5S_SCALAR))
              .write(H5::PredType::NATIVE_DOUBLE, &v);
      for (const Stage& s : stage_table())
        if (s.group == grp && c.has(s.name)) write_dataset(f, dataset_path(s), c.get(s.name));
    }
  });
}

void save_tensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& datasets) {
  write_atomically(path, [&](H5::H5File& f) {
    for (auto& [name, t] : datasets) write_dataset(f, name, t);
  });
}

void save_text(const std::string& path, const std::string& text) {
  std::string tmp = temp_path(path);
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(path, ": cannot write: ", std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    fail(path, ": cannot write: ", std::strerror(err));
  }
}

std::vector<DatasetInfo> list_datasets(const std::string& path, std::map<std::string, std::string>* attrs) {
  H5::H5File f = open_h5(path);
  std::vector<DatasetInfo> out;
  try {
    if (attrs) *attrs = read_root_attrs(f);
    for (auto& n : dataset_paths(f, path)) {
      H5::DataSet ds = f.openDataSet(n);
      DatasetInfo d;
      d.path = n;
      d.shape = dataset_shape(ds);
      d.is_float = ds.getTypeClass() == H5T_FLOAT;
      if (d.is_float) {
        d.values = read_float(f, path, n);
        d.type = float_type_name(ds.getFloatType());
      } else {
        d.type = class_name(ds.getTypeClass());
      }
      out.push_back(std::move(d));
    }
  } catch (const H5::Exception& e) {
    fail(path, ": read error in ", e.getFuncName(), " (truncated or corrupt file?)");
  }
  return out;
}

}  // namespace mhc

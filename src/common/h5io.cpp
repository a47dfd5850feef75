#include "h5io.h"

#include <H5Cpp.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <set>

#include "output_file.h"
#include "read_guard.h"
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

// Whether a float type has the layout of an IEEE-style format of `bytes` bytes with an esize-bit
// exponent (bias 2^(esize-1) - 1) and an msize-bit mantissa (implied leading bit), in either byte order.
bool has_layout(const H5::FloatType& ft, size_t bytes, size_t esize, size_t msize) {
  if (ft.getSize() != bytes || ft.getPrecision() != 8 * bytes || ft.getOffset() != 0) return false;
  size_t spos, epos, es, mpos, ms;
  ft.getFields(spos, epos, es, mpos, ms);
  return spos == 8 * bytes - 1 && epos == msize && es == esize && mpos == 0 && ms == msize &&
         H5Tget_ebias(ft.getId()) == (size_t(1) << (esize - 1)) - 1 && H5Tget_norm(ft.getId()) == H5T_NORM_IMPLIED;  // the C++ getEbias throws at a bias of 0
}

bool is_bf16(const H5::FloatType& ft) { return has_layout(ft, 2, 8, 7); }

H5::DataType mem_type(DType t) {
  switch (t) {
    case DType::bf16: return bf16_type();
    case DType::f32: return H5::PredType::NATIVE_FLOAT;
    case DType::f64: return H5::PredType::NATIVE_DOUBLE;
  }
  return H5::PredType::NATIVE_DOUBLE;
}

// The most specific message on HDF5's error stack ("required filter 'lzf' is not registered").
// libhdf5's sec2 driver describes a failed read or write with the time (and a newline), the
// buffer's address and byte counts: "file write failed: time = ..., error message = 'No space
// left on device', buf = 0x..., ...". Kept: "file write failed: No space left on device".
std::string tidy(const std::string& msg) {
  const std::string key = "error message = '";
  const size_t head = msg.find(": time = "), at = msg.find(key);
  if (head == std::string::npos || at == std::string::npos) return msg;
  const size_t from = at + key.size();
  return msg.substr(0, head) + ": " + msg.substr(from, msg.find('\'', from) - from);
}

// The most specific message of an HDF5 error stack, skipping the plugin loader's "can't open
// directory" that hides the real cause ("required filter 'lzf' is not registered").
std::string innermost(hid_t stack) {
  std::string msg;
  auto walk = [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
    auto* m = static_cast<std::string*>(data);
    bool plugin_search = e->func_name && std::string(e->func_name).rfind("H5PL", 0) == 0;
    if (m->empty() && e->desc && !plugin_search) *m = e->desc;
    return 0;
  };
  H5Ewalk2(stack, H5E_WALK_UPWARD, walk, &msg);
  return tidy(msg);
}

// HDF5 calls this on every failing API call, before the C++ wrappers clear the stack: it
// keeps the cause instead of printing it.
std::string g_last_cause;
herr_t keep_cause(hid_t stack, void*) {
  g_last_cause = innermost(stack);
  return 0;
}

// HDF5 prints nothing; h5_cause() can still say why the last call failed.
void quiet_hdf5() {
  g_last_cause.clear();
  H5Eset_auto2(H5E_DEFAULT, keep_cause, nullptr);
}

// Why the last HDF5 call failed.
std::string h5_cause() {
  std::string msg = innermost(H5E_DEFAULT);
  if (msg.empty()) msg = g_last_cause;
  return msg.empty() ? "truncated or corrupt file?" : msg;
}

// External links are followed only into regular files: HDF5 would open a FIFO or a device
// named by one, and block on it, before any check of ours. g_refused names the last refused.
std::string g_refused;
bool regular_or_absent(const std::string& name) {
  struct stat st;
  return stat(name.c_str(), &st) != 0 || S_ISREG(st.st_mode);
}
// Every name HDF5 may try for the link's file, in its order (libhdf5 1.10, H5F_prefix_open_file):
// an absolute name as given, then (relative, or an absolute one missing: its last component)
// under each HDF5_EXT_PREFIX directory, beside the linking file, and in the working directory.
// The first that exists is the file HDF5 reads, noted as read: no output replaces it.
herr_t regular_files_only(const char* parent_file, const char*, const char* child_file, const char*, unsigned*, hid_t, void*) {
  const std::string child = child_file, parent = parent_file, dir = parent.substr(0, parent.rfind('/') + 1);
  const std::string rel = child[0] == '/' ? child.substr(child.rfind('/') + 1) : child;
  std::vector<std::string> names;
  if (child[0] == '/') names.push_back(child);
  if (const char* env = std::getenv("HDF5_EXT_PREFIX"))
    for (std::string list = env; !list.empty();) {
      const size_t colon = list.find(':');
      if (std::string p = list.substr(0, colon); !p.empty()) names.push_back(p + "/" + rel);
      list = colon == std::string::npos ? "" : list.substr(colon + 1);
    }
  names.push_back(dir + rel), names.push_back(rel);
  bool noted = false;
  for (const std::string& name : names) {
    if (!regular_or_absent(name)) {
      g_refused = name;
      return -1;
    }
    struct stat st;
    if (!noted && stat(name.c_str(), &st) == 0) note_read_file(name), noted = true;
  }
  return 0;
}
hid_t link_access() {
  static const hid_t lapl = [] {
    hid_t l = H5Pcreate(H5P_LINK_ACCESS);
    H5Pset_elink_cb(l, regular_files_only, nullptr);
    return l;
  }();
  return lapl;
}
// HDF5's cause of a failed lookup, or the external link that was refused.
std::string lookup_cause() {
  std::string why = g_refused.empty() ? h5_cause() : cat("an external link into ", g_refused, ", which is not a regular file");
  g_refused.clear();
  return why;
}

// The type of the object at path (from loc, through soft and checked external links), or
// H5O_TYPE_UNKNOWN where the lookup fails (a missing or broken link); leaves no error behind.
H5O_type_t object_type(hid_t loc, const char* path) {
  H5O_info_t info;
  const bool found = H5Oget_info_by_name(loc, path, &info, link_access()) >= 0;
  H5Eclear2(H5E_DEFAULT);
  return found ? info.type : H5O_TYPE_UNKNOWN;
}

// False when a link on the path is absent; a failed lookup (corrupt file) is an error, never "absent".
bool link_exists(const H5::H5File& f, const std::string& file, const std::string& path) {
  // check every component: H5Lexists fails on a missing intermediate group
  for (size_t pos = path.find('/', 1);; pos = path.find('/', pos + 1)) {
    std::string prefix = path.substr(0, pos);
    htri_t e = H5Lexists(f.getId(), prefix.c_str(), link_access());
    if (e < 0) fail(file, ": ", prefix, ": cannot look up the link (", lookup_cause(), ")");
    if (e == 0) return false;
    if (pos == std::string::npos) return true;
    // a dataset on the way: HDF5's lookup below it fails with "message type not found"
    const H5O_type_t type = object_type(f.getId(), prefix.c_str());
    if (type == H5O_TYPE_DATASET || type == H5O_TYPE_NAMED_DATATYPE)
      fail(file, ": ", prefix, ": expected a group holding ", path.substr(pos + 1), ", found a ",
           type == H5O_TYPE_DATASET ? "dataset" : "named datatype");
  }
}

// Whether path (from loc, through soft and checked external links) is a dataset; a missing or
// broken link is no dataset.
bool dataset_at(hid_t loc, const char* path) { return object_type(loc, path) == H5O_TYPE_DATASET; }

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


// The dataset's shape, with its element count and bytes checked against overflow and the
// memory limit before anything is allocated.
Shape dataset_shape(const H5::DataSet& ds, const std::string& file, const std::string& path, bool whole = true) {
  H5::DataSpace sp = ds.getSpace();
  if (sp.getSimpleExtentType() == H5S_NULL) fail(file, ": ", path, ": null dataspace (no elements), expected an array");
  int rank = sp.getSimpleExtentNdims();
  if (rank < 0 || rank > 8) fail(file, ": ", path, ": rank ", rank, ", expected at most 8 dimensions");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank) sp.getSimpleExtentDims(dims.data());
  Shape shape(dims.begin(), dims.end());
  uint64_t count = 1;
  for (hsize_t d : dims)
    if (d > uint64_t(INT64_MAX) || __builtin_mul_overflow(count, uint64_t(d), &count) || count > uint64_t(INT64_MAX) / 8)
      fail(file, ": ", path, ": declared shape ", shape_str(shape), " has more elements than can be addressed");
  if (whole && count * 8 > memory_limit())
    fail(file, ": ", path, ": declared shape ", shape_str(shape), " needs ", double(count * 8) / 1e9,
         " GB as float64, more than the memory limit of ", double(memory_limit()) / 1e9,
         " GB (MHC_MAX_MEMORY=BYTES to change it)");
  return shape;
}

// The HDF5 float type's name: bfloat16, float16 (IEEE half), float32, float64 (IEEE layouts, read
// as they are), or "floatN-eEmM" (E exponent bits, M mantissa bits) for any other layout, which
// is read through float64 (a 4-byte float with a 10-bit exponent is no float32).
std::string float_type_name(const H5::FloatType& ft) {
  if (is_bf16(ft)) return "bfloat16";
  if (has_layout(ft, 2, 5, 10)) return "float16";
  if (has_layout(ft, 4, 8, 23)) return "float32";
  if (has_layout(ft, 8, 11, 52)) return "float64";
  size_t spos, epos, esize, mpos, msize;
  ft.getFields(spos, epos, esize, mpos, msize);
  return cat("float", ft.getSize() * 8, "-e", esize, "m", msize);
}

// Chunks: filtered ones larger than kMaxChunkBytes are refused (check_storage). A read of a block of
// tokens touches a row of chunks (all chunks of the first axis's chunk index); libhdf5's cache
// (kDefaultChunkCache) must hold that row, or every block inflates its chunks again: x as one gzip
// chunk of 2^21 tokens took over 60 s to diff a 53 KB file, block after block. Opened with a
// cache of the row's bytes, at most kMaxChunkBytes (fully read chunks are evicted first).
constexpr uint64_t kMaxChunkBytes = uint64_t(64) << 20, kDefaultChunkCache = uint64_t(1) << 20;
uint64_t chunk_row_bytes(hid_t ds, hid_t dcpl, uint64_t* chunks) {
  *chunks = 1;
  hsize_t chunk[H5S_MAX_RANK], dims[H5S_MAX_RANK];
  const int rank = H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk);
  hid_t space = H5Dget_space(ds), type = H5Dget_type(ds);
  const int drank = space >= 0 ? H5Sget_simple_extent_dims(space, dims, nullptr) : -1;
  uint64_t row = type >= 0 ? H5Tget_size(type) : 0;
  if (space >= 0) H5Sclose(space);
  if (type >= 0) H5Tclose(type);
  if (rank <= 0 || drank != rank) return 0;
  bool huge = __builtin_mul_overflow(row, uint64_t(chunk[0]), &row);
  for (int i = 1; i < rank; ++i) {
    const uint64_t count = chunk[i] ? (dims[i] + chunk[i] - 1) / chunk[i] : 0;
    huge = huge || __builtin_mul_overflow(row, count * chunk[i], &row) || __builtin_mul_overflow(*chunks, count, chunks);
  }
  return huge ? UINT64_MAX : row;
}

// Opens the dataset at path, naming the file, the path and the cause on failure. The C API
// is called directly where HDF5's cause matters: the C++ wrappers clear the error stack.
H5::DataSet open_dataset(const H5::H5File& f, const std::string& file, const std::string& path) {
  H5O_info_t info;
  if (H5Oget_info_by_name(f.getId(), path.c_str(), &info, link_access()) < 0)
    fail(file, ": ", path, ": cannot open (", lookup_cause(), ")");
  if (info.type != H5O_TYPE_DATASET)
    fail(file, ": ", path, ": is a ", info.type == H5O_TYPE_GROUP ? "group" : "named datatype", ", expected a dataset");
  hid_t id = H5Dopen2(f.getId(), path.c_str(), H5P_DEFAULT);  // the link resolved above
  if (id < 0) fail(file, ": ", path, ": cannot open (", h5_cause(), ")");
  // A virtual dataset is refused before its dataspace is asked for: with an unlimited mapping
  // that opens its source files (a FIFO among them hung), and one whose source is itself
  // recurses until the stack overflows.
  hid_t dcpl = H5Dget_create_plist(id);
  const H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
  uint64_t chunks = 1;
  const uint64_t cache = layout == H5D_CHUNKED ? chunk_row_bytes(id, dcpl, &chunks) : 0;
  if (dcpl >= 0) H5Pclose(dcpl);
  if (layout == H5D_VIRTUAL) {
    H5Dclose(id);
    fail(file, ": ", path, ": a virtual dataset (not read: store the data itself)");
  }
  if (cache > kDefaultChunkCache) {  // reopened with a chunk cache that holds a row of chunks
    H5Dclose(id);
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
    // hash slots: about 10 a chunk of the row (libhdf5 evicts a chunk whose slot another takes)
    H5Pset_chunk_cache(dapl, size_t(std::clamp<uint64_t>(10 * chunks + 1, 12421, 1 << 22)), size_t(std::min(cache, kMaxChunkBytes)), 1.0);
    id = H5Dopen2(f.getId(), path.c_str(), dapl);
    H5Pclose(dapl);
    if (id < 0) fail(file, ": ", path, ": cannot open (", h5_cause(), ")");
  }
  H5::DataSet ds(id);  // takes its own reference
  H5Dclose(id);
  return ds;
}

// Where libhdf5 reads external raw storage `name` from (libhdf5 1.10, H5D__build_file_prefix):
// under HDF5_EXTFILE_PREFIX where set (${ORIGIN}: the file's directory), else as given, a
// relative name from the working directory.
// The directory external raw storage named `name` (relative) is read below: HDF5_EXTFILE_PREFIX
// (its ${ORIGIN} the directory of `file`), else the working directory.
std::string external_dir(const std::string& file) {
  const char* env = std::getenv("HDF5_EXTFILE_PREFIX");
  if (!env || !*env) return ".";
  std::string prefix = env;
  const std::string origin = "${ORIGIN}", dir = file.rfind('/') == std::string::npos ? "." : file.substr(0, file.rfind('/'));
  if (size_t at = prefix.find(origin); at != std::string::npos) prefix.replace(at, origin.size(), dir);
  return prefix;
}

std::string external_path(const std::string& name, const std::string& file) {
  const std::string dir = external_dir(file);
  return name.empty() || name[0] == '/' || dir == "." ? name : dir + "/" + name;
}

// Whether the existing file `where` resolves (symbolic links followed) to a place outside `dir`:
// a symbolic link beside the case (./sec -> /etc/passwd) would copy that file into the outputs.
bool resolves_outside(const std::string& where, const std::string& dir) {
  std::error_code e1, e2;
  const std::filesystem::path to = std::filesystem::canonical(where, e1), base = std::filesystem::canonical(dir, e2);
  if (e1 || e2) return false;  // absent: libhdf5 reports it
  const auto [b, t] = std::mismatch(base.begin(), base.end(), to.begin(), to.end());
  return b != base.end() || t == to.end();
}

// Storage that libhdf5 1.10 cannot be trusted to read, refused before it is read:
// - a compact dataset whose stored bytes are fewer than its shape needs (it reads past its own
//   buffer: tests/fuzz/repro/corrupt_compact_overread.h5);
// - external raw storage in a file that is not a regular file (a FIFO blocks the read);
// - chunks larger than kMaxChunkBytes: libhdf5 inflates a whole chunk for every read that touches
//   it and the cache cannot hold it (a 4 GB gzip chunk of an 8-token x took 4.2 GB and 23 s; one
//   of 512 MB, 119 s to diff 530 KB of data, a block of tokens at a time).
// (A virtual dataset is refused when it is opened: open_dataset.)
void check_storage(const H5::DataSet& ds, const Shape& shape, const std::string& file, const std::string& path) {
  hid_t dcpl = H5Dget_create_plist(ds.getId());
  const H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
  if (layout == H5D_CHUNKED) {
    hsize_t dims[H5S_MAX_RANK];
    const int rank = H5Pget_chunk(dcpl, H5S_MAX_RANK, dims);
    hid_t type = H5Dget_type(ds.getId());
    const uint64_t elem = type >= 0 ? H5Tget_size(type) : 1;
    if (type >= 0) H5Tclose(type);
    uint64_t chunk = elem, nominal = elem * uint64_t(numel(shape));
    bool huge = false;
    for (int i = 0; i < rank; ++i) huge = huge || __builtin_mul_overflow(chunk, uint64_t(dims[i]), &chunk);
    // filtered (compressed): libhdf5 inflates a whole chunk for every read that touches it, so the
    // chunk cache must hold it; unfiltered, it reads the selection, and only a chunk far larger
    // than its dataset is refused
    const bool filtered = H5Pget_nfilters(dcpl) > 0;
    if (huge || chunk > (filtered ? kMaxChunkBytes : std::max(nominal, kMaxChunkBytes))) {
      H5Pclose(dcpl);
      fail(file, ": ", path, ": ", filtered ? "filtered " : "", "chunks of ",
           huge ? std::string("more than 2^64") : std::to_string(chunk), " bytes, more than ",
           filtered ? cat(kMaxChunkBytes, " (libhdf5 inflates a whole chunk for every read)")
                    : cat("the dataset's ", nominal, " and ", kMaxChunkBytes),
           ": rewrite it with smaller chunks (h5repack -l CHUNK=...)");
    }
  }
  hid_t type = H5Dget_type(ds.getId());
  const uint64_t need = uint64_t(numel(shape)) * (type >= 0 ? H5Tget_size(type) : 0);  // the bytes a read takes
  if (type >= 0) H5Tclose(type);
  std::string refused;
  uint64_t left = need;  // bytes still to come from the segments, in their order
  for (int i = 0, n = dcpl >= 0 ? H5Pget_external_count(dcpl) : 0; i < n && refused.empty(); ++i) {
    char name[4096] = "";
    off_t offset;
    hsize_t size;
    if (H5Pget_external(dcpl, unsigned(i), sizeof name, name, &offset, &size) < 0) continue;
    const std::string where = external_path(name, file), given = name;
    const uint64_t take = std::min<uint64_t>(left, size);
    left -= take;
    const std::filesystem::path parts(given);
    const bool above = std::any_of(parts.begin(), parts.end(), [](const std::filesystem::path& c) { return c == ".."; });
    struct stat st;
    if (given.empty() || given[0] == '/' || above)
      refused = cat(where, " (not read: external raw storage must be a relative name below the working directory or "
                           "HDF5_EXTFILE_PREFIX, not ", given.empty() ? "empty" : given[0] == '/' ? "absolute" : "above it",
                    ": a case file could copy any file into its outputs)");
    else if (!regular_or_absent(where))
      refused = cat(where, ", which is not a regular file");
    else if (const std::string dir = external_dir(file); resolves_outside(where, dir))
      refused = cat(where, " (not read: through a symbolic link it leads to ", std::filesystem::canonical(where).string(),
                    ", outside ", dir == "." ? "the working directory" : dir, ": a case file could copy any file into its outputs)");
    else if (stat(where.c_str(), &st) == 0 && take > 0 && uint64_t(st.st_size) < uint64_t(offset) + take)
      refused = cat(where, ", which holds ", st.st_size, " bytes, fewer than the ", uint64_t(offset) + take,
                    " this segment reads (libhdf5 would read the rest as zeros)");
    note_read_file(where);
  }
  if (dcpl >= 0) H5Pclose(dcpl);
  if (!refused.empty()) fail(file, ": ", path, ": stored externally in ", refused);
  if (layout != H5D_COMPACT) return;
  if (uint64_t have = ds.getStorageSize(); have < need)
    fail(file, ": ", path, ": compact storage holds ", have, " bytes, fewer than the ", need, " its shape needs (corrupt file)");
}

// H5Dread of the selection, failing with HDF5's own cause (a missing filter or external file).
void read_into(const H5::DataSet& ds, hid_t mem_type_id, hid_t mem_space, hid_t file_space, void* buf,
               const std::string& file, const std::string& path) {
  if (H5Dread(ds.getId(), mem_type_id, mem_space, file_space, H5P_DEFAULT, buf) < 0)
    fail(file, ": ", path, ": cannot read (", h5_cause(), ")");
}

// A float type that cannot hold float32 values (float16, or fewer than 23 mantissa bits).
bool narrower_than_f32(const H5::FloatType& ft) {
  size_t spos, epos, esize, mpos, msize;
  ft.getFields(spos, epos, esize, mpos, msize);
  return esize < 8 || msize < 23;
}

// A float dataset, opened and checked: bf16/float32/float64 are read as they are, other
// float formats as float64 (`stored` names those narrower than float32). `check` sees the
// declared shape before anything is read; `whole`: the whole dataset must fit in memory.
struct FloatDataset {
  H5::DataSet ds;
  Shape shape;
  DType dt = DType::f64;
  std::string stored;
};

// A chunked dataset some of whose chunks were never written (they read as the fill value). Not
// H5Dget_space_status: libhdf5 1.10 calls a fully written dataset with a compressed chunk
// "partly allocated" (its stored bytes are fewer than its elements' size).
bool partly_written(const H5::DataSet& ds) {
  H5::DSetCreatPropList dcpl = ds.getCreatePlist();
  if (dcpl.getLayout() != H5D_CHUNKED) return false;
  const int rank = dcpl.getChunk(0, nullptr);
  std::vector<hsize_t> chunk(size_t(std::max(rank, 0))), dims(chunk.size());
  if (rank <= 0 || dcpl.getChunk(rank, chunk.data()) != rank) return false;
  H5::DataSpace space = ds.getSpace();
  if (space.getSimpleExtentNdims() != rank) return false;
  space.getSimpleExtentDims(dims.data());
  hsize_t want = 1, have = 0;
  for (int i = 0; i < rank; ++i) {
    if (dims[size_t(i)] == 0) return false;
    if (chunk[size_t(i)] == 0 || __builtin_mul_overflow(want, (dims[size_t(i)] + chunk[size_t(i)] - 1) / chunk[size_t(i)], &want))
      return false;
  }
  const bool ok = H5Dget_num_chunks(ds.getId(), space.getId(), &have) >= 0;
  H5Eclear2(H5E_DEFAULT);
  return ok && have < want;
}

FloatDataset open_float(const H5::H5File& f, const std::string& file, const std::string& path, bool whole = true,
                        const std::function<void(const Shape&)>& check = nullptr) {
  FloatDataset d;
  d.ds = open_dataset(f, file, path);
  if (const H5T_class_t type = d.ds.getTypeClass(); type != H5T_FLOAT)  // 16-bit integers: bf16 bits (tensor.view(torch.int16))?
    fail(file, ": ", path, ": expected a floating-point dataset, found ", class_name(type),
         type == H5T_INTEGER && d.ds.getDataType().getSize() == 2
             ? " of 16 bits (bf16 bit patterns? write them as float32, exact: tensor.float().numpy(); see docs/schema.md)"
             : "");
  H5::FloatType ft = d.ds.getFloatType();
  std::string name = float_type_name(ft);
  d.dt = name == "bfloat16" ? DType::bf16 : name == "float32" ? DType::f32 : DType::f64;
  if (d.dt == DType::f64 && name != "float64" && narrower_than_f32(ft)) d.stored = name;
  d.shape = dataset_shape(d.ds, file, path, whole);
  if (check) check(d.shape);
  check_storage(d.ds, d.shape, file, path);
  H5D_space_status_t status;
  if (numel(d.shape) > 0 && H5Dget_space_status(d.ds.getId(), &status) >= 0 &&
      status == H5D_SPACE_STATUS_NOT_ALLOCATED && d.ds.getStorageSize() == 0)
    fail(file, ": ", path, ": declared ", shape_str(d.shape), " but never written (no data stored)");
  // chunks never written read as the fill value: a file of a few KB declared 2^36 tokens of them,
  // and run and diff worked through them for hours; a dump's stage so was compared as data, and
  // `run --backend exec` copied it as written (review B, session 20)
  if (partly_written(d.ds))
    fail(file, ": ", path, ": declared ", shape_str(d.shape), " but only partly written (chunks missing, which would ",
         "read as the fill value); write every element");
  return d;
}

Tensor read_all(const FloatDataset& d, const std::string& file, const std::string& path) {
  dataset_shape(d.ds, file, path, true);  // the memory check
  Tensor t(d.shape, d.dt);
  if (t.size()) read_into(d.ds, mem_type(d.dt).getId(), H5S_ALL, H5S_ALL, t.bytes.data(), file, path);
  return t;
}

// Tokens [t0, t1) of the flattened token axis of a dataset of shape `full` whose first
// `lead` axes are the tokens, as hyperslab boxes (one per batch row for [B,S,..] layouts):
// box(start, count, first token, tokens) for each.
template <class F> void token_boxes(const Shape& full, size_t lead, int64_t t0, int64_t t1, F&& box) {
  const int64_t seq = lead == 2 ? full[1] : t1;
  for (int64_t at = t0; at < t1;) {
    std::vector<hsize_t> start(full.size(), 0), count(full.begin(), full.end());
    const int64_t rows = std::min(seq - at % seq, t1 - at);
    if (lead == 2) start[0] = hsize_t(at / seq), count[0] = 1;
    start[lead - 1] = hsize_t(at % seq), count[lead - 1] = hsize_t(rows);
    box(start, count, at, rows);
    at += rows;
  }
}

// Tokens [t0, t1) of the flattened token axis of a dataset whose first `lead` axes are the tokens.
Tensor read_tokens(const FloatDataset& d, size_t lead, int64_t t0, int64_t t1, const std::string& file,
                   const std::string& path) {
  Shape shape = {t1 - t0};
  shape.insert(shape.end(), d.shape.begin() + int64_t(lead), d.shape.end());
  Tensor t(shape, d.dt);
  const int64_t per = t1 > t0 ? t.size() / (t1 - t0) : 0;
  if (per == 0) return t;
  H5::DataSpace file_space = d.ds.getSpace();
  token_boxes(d.shape, lead, t0, t1, [&](auto& start, auto& count, int64_t at, int64_t rows) {
    file_space.selectHyperslab(H5S_SELECT_SET, count.data(), start.data());
    hsize_t elements = hsize_t(rows * per);
    H5::DataSpace mem(1, &elements);
    read_into(d.ds, mem_type(d.dt).getId(), mem.getId(), file_space.getId(),
              t.bytes.data() + size_t((at - t0) * per) * dtype_size(d.dt), file, path);
  });
  return t;
}

// Every dataset's path in the file ("/forward/h_mix"); a failed walk is an error, never "empty".
// Objects inside more than kMaxGroupDepth nested groups are refused: a case needs two levels,
// and HDF5's walk takes time cubic in the depth (1000 nested groups: 9 s, 2000: 70 s; 256: 0.1 s).
constexpr int kMaxGroupDepth = 256;
std::vector<std::string> dataset_paths(const H5::H5File& f, const std::string& file) {
  struct Walk {
    std::vector<std::string> names;
    std::string too_deep;  // the first object below kMaxGroupDepth levels, when there is one
  } walk;
  auto visit = [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    Walk& w = *static_cast<Walk*>(data);
    if (std::count(name, name + std::strlen(name), '/') > kMaxGroupDepth) {
      w.too_deep = name;
      return 1;  // stops the walk
    }
    if (info->type == H5O_TYPE_DATASET) w.names.push_back(cat("/", name));
    return 0;
  };
  if (H5Ovisit(f.getId(), H5_INDEX_NAME, H5_ITER_NATIVE, visit, &walk) < 0)
    fail(file, ": cannot list the file's datasets (", h5_cause(), ")");
  if (!walk.too_deep.empty()) {
    fail(file, ": an object inside more than ", kMaxGroupDepth, " nested groups (/", walk.too_deep.substr(0, 60),
         "...): not an mhc case");
  }
  return walk.names;
}

// Rounds an input to the dtype the stage table gives it, counting what changed.
Tensor to_input_dtype(const Tensor& raw, DType want, const std::string& where, const LoadOptions& opt,
                      bool* warned = nullptr) {
  const bool same = raw.dtype == want;
  Tensor t = same ? raw : convert(raw, want);
  int64_t inexact = 0, nan = 0, inf = 0, overflow = 0;  // overflow: finite in the file, Inf once rounded
#pragma omp parallel for schedule(static) reduction(+ : inexact, nan, inf, overflow)
  for (int64_t i = 0; i < t.size(); ++i) {
    double b = t.at(i);
    if (!same) {
      double a = raw.at(i);
      inexact += a != b && !(std::isnan(a) && std::isnan(b));
      overflow += std::isinf(b) && std::isfinite(a);
    }
    nan += std::isnan(b);
    inf += std::isinf(b);
  }
  if (overflow && !opt.allow_nonfinite)
    fail(where, overflow, " finite values overflow ", dtype_name(want), " when rounded to it (its largest is ",
         want == DType::bf16 ? "3.39e38" : "3.40e38", ")");
  if (inexact && opt.strict)
    fail(where, inexact, " of ", t.size(), " values are not exactly representable in ", dtype_name(want),
         " (--strict)");
  if (warned) *warned = inexact && !opt.quiet;
  if (inexact && !opt.quiet)
    std::cerr << "mhc: warning: " << where << inexact << " of " << t.size() << " values rounded to "
              << dtype_name(want) << " (nearest even)\n";
  if ((nan || inf) && !opt.allow_nonfinite)
    fail(where, nan, " NaN and ", inf, " Inf values (use --allow-nonfinite to accept them)");
  return t;
}

double read_eps(const H5::Group& g, const char* name, double dflt, const std::string& where) {
  if (!g.attrExists(name)) return dflt;
  H5::Attribute a = g.openAttribute(name);
  H5::DataSpace sp = a.getSpace();
  H5T_class_t cls = a.getTypeClass();
  if ((cls != H5T_FLOAT && cls != H5T_INTEGER) || sp.getSimpleExtentType() == H5S_NULL || sp.getSimpleExtentNpoints() != 1)
    fail(where, "attribute ", name, ": expected one number, found ", class_name(cls), " with ",
         sp.getSimpleExtentType() == H5S_NULL ? 0 : sp.getSimpleExtentNpoints(), " elements");
  double v = 0;
  a.read(H5::PredType::NATIVE_DOUBLE, &v);
  // above 1 an eps is no longer small beside what it guards (a mean of squares of ~1, a gate in
  // (0, 1)): hc_eps = 1e40 made every h_pre 1e40 and the fp32 run overflow
  if (!(v >= 0 && v <= 1)) fail(where, "attribute ", name, " = ", v, ": expected a value in [0, 1]");
  return v;
}

// A per-token dataset that chunks are read from.
struct TokenDataset {
  const Stage* stage;
  std::string path;
  FloatDataset data;
  bool fits;  // stored in the schema's shape (else the diff reports it as a format problem)
};

// Validates /inputs, reads the parameters into c and lists the per-token inputs in `tok`.
// /inputs holds the schema's inputs only: a name it does not know is an error, not a default
// silently used (/inputs/gama ran with gamma = 1), and so is an attribute named like norm_eps or
// hc_eps but not them (norm_epsilon ran with norm_eps = 1e-6), and so is either of them on / or
// on an input dataset.
bool eps_like(const std::string& a) {  // norm_eps, hc_eps, a near miss of them or another eps (rms_eps, eps)
  std::string lower = a;
  for (char& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  const bool eps_word = ("_" + lower + "_").find("_eps_") != std::string::npos;  // "eps", "rms_eps": review B, session 23
  return eps_word || lower.find("epsilon") != std::string::npos || edit_distance(a, "norm_eps") <= 2 ||
         edit_distance(a, "hc_eps") <= 2;
}

// A group member of /inputs that is / or /inputs itself (a link back up: it holds nothing new).
bool cycle(hid_t inputs, const char* name) {
  H5O_info_t member, root, self;
  const bool ok = H5Oget_info_by_name(inputs, name, &member, link_access()) >= 0 &&
                  H5Oget_info_by_name(inputs, "/", &root, H5P_DEFAULT) >= 0 && H5Oget_info(inputs, &self) >= 0;
  H5Eclear2(H5E_DEFAULT);
  return ok && (member.addr == root.addr || member.addr == self.addr);
}

void check_input_names(const H5::H5File& f, const std::string& file) {
  std::string bad;
  auto link = [](hid_t group, const char* name, const H5L_info_t*, void* data) -> herr_t {
    const Stage* s = find_stage(name);
    if (s && s->group == Group::inputs) return 0;
    // a dangling link holds nothing; a group (a cycle back to / too) may hold what the schema
    // reads at /inputs itself: /inputs/params/gamma ran with gamma = 1 (review B, session 23)
    if (!dataset_at(group, name) && (object_type(group, name) != H5O_TYPE_GROUP || cycle(group, name))) return 0;
    *static_cast<std::string*>(data) = name;
    return 1;  // stops the iteration
  };
  auto attr = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {  // a near miss of the two
    const std::string a = name;
    if (a == "norm_eps" || a == "hc_eps" || !eps_like(a)) return 0;
    *static_cast<std::string*>(data) = a;
    return 1;
  };
  hid_t g = H5Gopen2(f.getId(), "/inputs", H5P_DEFAULT);
  if (g < 0) fail(file, ": /inputs: cannot open (", h5_cause(), ")");
  const herr_t links = H5Literate(g, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, link, &bad);
  const std::string links_failed = links < 0 ? h5_cause() : "";
  const herr_t attrs = bad.empty() && links >= 0 ? H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, attr, &bad) : 0;
  const std::string attrs_failed = attrs < 0 ? h5_cause() : "";
  H5Gclose(g);
  H5Eclear2(H5E_DEFAULT);
  g_refused.clear();  // an input behind a refused external link is reported when it is opened
  if (links < 0) fail(file, ": /inputs: cannot list its members (", links_failed, ")");
  if (attrs < 0) fail(file, ": /inputs: cannot list its attributes (", attrs_failed, ")");
  if (!bad.empty() && attrs > 0)
    fail(file, ": /inputs: attribute ", bad, " is not norm_eps or hc_eps, the two the schema reads (see docs/schema.md)");
  if (!bad.empty()) {
    const std::string hint = suggest_stage("/inputs/" + bad);
    fail(file, ": /inputs/", bad, ": not an input of the schema (", hint.empty() ? "" : hint + " ",
         "it has x, phi, alpha, bias, gamma, dh_in, dh_post and dh_res; keep other tensors outside /inputs)");
  }
}

// norm_eps or hc_eps on / or on an input dataset (h5py's f.attrs, x.attrs) ran with the defaults.
// Called once the inputs were opened safely (an external link into a FIFO is refused before
// anything here opens it).
void check_eps_placement(const H5::H5File& f, const std::string& file) {
  auto misplaced = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
    if (!eps_like(name)) return 0;
    *static_cast<std::string*>(data) = name;
    return 1;
  };
  std::string off;
  for (const char* at : {"/", "/inputs/x", "/inputs/phi", "/inputs/alpha", "/inputs/bias", "/inputs/gamma"}) {
    const bool root = at[1] == '\0';
    H5L_info_t li;
    if (!root && (!link_exists(f, file, at) || H5Lget_info(f.getId(), at, &li, H5P_DEFAULT) < 0 || li.type != H5L_TYPE_HARD))
      continue;  // a soft or external link: what it names was opened and checked where it is read
    hid_t o = H5Oopen(f.getId(), at, H5P_DEFAULT);
    if (o < 0) continue;  // opened and reported where it is read
    const herr_t found = H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, misplaced, &off);
    H5Oclose(o);
    H5Eclear2(H5E_DEFAULT);
    if (found > 0)
      fail(file, ": ", at, ": attribute ", off, " would be ignored here: the schema reads norm_eps and hc_eps on /inputs "
           "only (h5py: f['inputs'].attrs['norm_eps'] = ...)");
  }
}

void read_inputs_head(const H5::H5File& f, const std::string& file, const LoadOptions& opt, Case& c,
                      std::vector<TokenDataset>& tok) {
  if (!link_exists(f, file, "/inputs"))
    fail(file, ": /inputs: missing group (expected an mhc case; to diff a dump of stages only, give its inputs: "
         "--input IN.h5; see docs/schema.md)");
  // the group itself through checked external links: one into a FIFO blocked the opens below
  if (const H5O_type_t type = object_type(f.getId(), "/inputs"); type != H5O_TYPE_GROUP)
    fail(file, ": /inputs: ",
         type == H5O_TYPE_UNKNOWN ? cat("cannot open (", lookup_cause(), ")")
                                  : cat("expected a group of inputs, found a ", type == H5O_TYPE_DATASET ? "dataset" : "named datatype"));
  auto where = [&](const Stage& s) { return cat(file, ": ", dataset_path(s), ": "); };
  check_input_names(f, file);

  const Stage& xs = shape_input();
  if (!link_exists(f, file, dataset_path(xs)))
    fail(where(xs), "missing dataset (expected bfloat16 [T,n,D] or [B,S,n,D])");
  Shape xshape = dataset_shape(open_dataset(f, file, dataset_path(xs)), file, dataset_path(xs), false);
  if (xshape.size() != 3 && xshape.size() != 4)
    fail(where(xs), "expected rank 3 [T,n,D] or 4 [B,S,n,D], found ", shape_str(xshape));
  if (numel(xshape) == 0) fail(where(xs), "zero-size dimension in ", shape_str(xshape));
  c.prob.tokens.assign(xshape.begin(), xshape.end() - 2);
  c.prob.n = xshape[xshape.size() - 2];
  c.prob.D = xshape.back();
  // phi is [n*n+2n, n*D]: its size is checked before N or K is ever formed
  if (phi_elements(c.prob.n, c.prob.D) == 0)
    fail(where(xs), "n = ", c.prob.n, ", D = ", c.prob.D, " from ", shape_str(xshape),
         ": phi [n*n+2n, n*D] would have more elements than can be addressed");
  const int64_t held = opt.stream_tokens ? std::min(opt.stream_tokens, c.prob.T()) : c.prob.T();
  check_memory(where(xs), c.prob, case_bytes(c.prob, opt.stream_tokens > 0).with(double(held)) * opt.copies);

  for (const Stage& s : stage_table()) {
    if (s.group != Group::inputs) continue;
    Shape want = stage_shape(s, c.prob);
    if (!link_exists(f, file, dataset_path(s))) {
      if (s.absent == Absent::ones) {
        Tensor ones(want, DType::f32);
        for (int64_t i = 0; i < ones.size(); ++i) ones.data<float>()[i] = 1.0f;
        c.t[s.name] = std::move(ones);
      } else if (s.absent == Absent::error) {
        fail(where(s), "missing dataset (expected ", dtype_name(s.dtype), " ", stage_shape_str(s), " = ",
             shape_str(want), ")");
      }
      continue;
    }
    auto check = [&](const Shape& found) {
      if (found == want) return;
      const bool k_last = !s.dims.empty() && s.dims.back() == Dim::k;
      std::string hint = k_last && found.size() == want.size() && found.back() != c.prob.K()
                             ? cat("; ", xs.name, " gives n*D = ", c.prob.K(), " but ", s.name, " has ", found.back(), " columns")
                             : "";
      const std::string named = stage_shape_str(s), dims = shape_str(want);  // "[N,K] = [24,1024]", or "[3]"
      fail(where(s), "expected shape ", named == dims ? named : cat(named, " = ", dims), " (n=", c.prob.n,
           ", D=", c.prob.D, " from ", dataset_path(xs), "), found ", shape_str(found), hint);
    };
    FloatDataset d = open_float(f, file, dataset_path(s), !per_token(s), check);
    if (per_token(s)) tok.push_back({&s, dataset_path(s), d, true});
    else c.t[s.name] = to_input_dtype(read_all(d, file, dataset_path(s)), s.dtype, where(s), opt);
  }

  int grads = 0;
  for (const TokenDataset& t : tok) grads += t.stage->absent == Absent::forward_only;
  const std::vector<std::string>& all = gradient_inputs();
  if (grads != 0 && grads != int(all.size())) {
    std::string names;
    for (auto& g : all) names += cat(names.empty() ? "" : ", ", g);
    fail(file, ": /inputs: ", grads, " of the ", all.size(), " gradients ", names, " present: backward needs all ",
         all.size(), " (or none, for forward only)");
  }

  H5::Group g = f.openGroup("/inputs");
  std::string gw = cat(file, ": /inputs: ");
  for (const char* eps : {"norm_eps", "hc_eps"})
    if (!g.attrExists(eps)) c.eps_defaulted.push_back(eps);
  c.prob.norm_eps = read_eps(g, "norm_eps", 1e-6, gw);
  c.prob.hc_eps = read_eps(g, "hc_eps", 1e-6, gw);
  check_eps_placement(f, file);
}

// The producer's string attributes on the root group (producer, version, backend, ...);
// anything but a single fixed or variable-length string is skipped, an empty one reads as "".
std::map<std::string, std::string> read_root_attrs(const H5::H5File& f) {
  std::map<std::string, std::string> attrs;
  for (const char* key : {"producer", "version", "backend", "precision", "device"}) {
    if (H5Aexists(f.getId(), key) <= 0) continue;
    hid_t a = H5Aopen(f.getId(), key, H5P_DEFAULT), type = a < 0 ? -1 : H5Aget_type(a), space = a < 0 ? -1 : H5Aget_space(a);
    bool one = space >= 0 && H5Sget_simple_extent_type(space) != H5S_NULL && H5Sget_simple_extent_npoints(space) == 1;
    if (type >= 0 && one && H5Tget_class(type) == H5T_STRING) {
      hid_t mem = H5Tcopy(H5T_C_S1);
      if (H5Tis_variable_str(type) > 0) {
        char* p = nullptr;
        H5Tset_size(mem, H5T_VARIABLE);
        if (H5Aread(a, mem, &p) >= 0 && p) attrs[key] = p;
        if (p) H5free_memory(p);
      } else if (size_t n = H5Tget_size(type); n > 0 && n <= 4096) {
        std::string buf(n + 1, '\0');
        H5Tset_size(mem, n + 1);
        if (H5Aread(a, mem, buf.data()) >= 0) attrs[key] = buf.c_str();
      }
      H5Tclose(mem);
    }
    for (hid_t id : {space, type}) if (id >= 0) H5Idec_ref(id);
    if (a >= 0) H5Aclose(a);
  }
  H5Eclear2(H5E_DEFAULT);
  return attrs;
}

// Reads the sums over tokens into c, lists the per-token stages in `tok`, and notes
// datasets that are not in the schema.
void read_outputs_head(const H5::H5File& f, const std::string& file, Case& c, std::vector<TokenDataset>& tok) {
  const std::vector<std::string> paths = dataset_paths(f, file);
  std::set<std::string> placed;  // stages with a dataset at their schema path (through a soft link too)
  for (const Stage& s : stage_table())
    if (s.group != Group::inputs && dataset_at(f.getId(), dataset_path(s).c_str())) placed.insert(s.name);
    else if (s.group != Group::inputs && link_exists(f, file, dataset_path(s)))  // was "missing in A", and a match
      fail(file, ": ", dataset_path(s), " is not a dataset (a group, or a link to nothing); the schema stores each stage as one");
  g_refused.clear();  // an external link refused here is reported where the walk below meets it
  // A stage at its schema path: the shape against the schema before anything is read (a sum
  // over tokens in another shape is not read: four declared at 1.2e8 elements each, each under
  // the memory limit, were read whole, 7.9 GB, before the diff found them misshapen).
  std::set<std::string> taken;
  auto take = [&](const Stage& s, const std::string& path) {
    taken.insert(s.name);
    FloatDataset d = open_float(f, file, path, false);
    if (!d.stored.empty()) c.stored_as[s.name] = d.stored;
    const std::string how = shape_mismatch(s, d.shape, c.prob);
    if (!how.empty()) c.misshapen[s.name] = how;
    if (per_token(s)) tok.push_back({&s, path, d, how.empty()});
    else if (how.empty()) c.t[s.name] = read_all(d, file, path);
  };
  for (const std::string& path : paths) {
    std::string group = path.substr(0, path.rfind('/'));
    const Stage* s = find_stage(path.substr(path.rfind('/') + 1));
    if (s && path == dataset_path(*s)) {
      if (s->group != Group::inputs) take(*s, path);
    } else if (group.empty() || group == "/inputs" || group == "/forward" || group == "/backward" ||
               misspelled_group(group) || (s && s->group != Group::inputs && !placed.count(s->name))) {
      // other groups are the user's own, unless they hold a stage missing from its schema path
      // (/fwd/h_mix without /forward/h_mix: the forward was not compared, and the verdict
      // blamed the backward stages that inherited its error)
      c.unknown.push_back(path);
    }
  }
  // a stage reached at its schema path only through a soft link (the walk follows hard links,
  // and "14 stages compared" left it out in silence), or through a second hard link
  for (const Stage& s : stage_table())
    if (placed.count(s.name) && !taken.count(s.name)) take(s, dataset_path(s));
  c.attrs = read_root_attrs(f);
}

H5::H5File open_h5(const std::string& path) {
  ReadingFile reading(path);
  quiet_hdf5();
  struct stat st;
  if (stat(path.c_str(), &st) != 0) fail(path, ": cannot open: ", std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail(path, ": is a directory, expected an HDF5 file");
  if (!S_ISREG(st.st_mode)) fail(path, ": is not a regular file (a FIFO or device?), expected an HDF5 file");
  if (int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC); fd < 0)
    fail(path, ": cannot read: ", std::strerror(errno));
  else
    close(fd);
  if (H5Fis_hdf5(path.c_str()) <= 0) fail(path, ": not an HDF5 file");
  note_read_file(path);
  try {
    return H5::H5File(path, H5F_ACC_RDONLY);
  } catch (const H5::Exception&) {
    const std::string cause = h5_cause();  // e.g. a lock another program holds
    fail(path, ": cannot open as HDF5 (", cause.empty() ? "truncated or corrupt file?" : cause, ")");
  }
}

// A string attribute, cut to its first 16 KiB with a note of its length: libhdf5 1.10 refuses an
// attribute over 64 KiB in the object header, and a working exec kernel whose command was that
// long could not be written (review B, session 21).
void write_str_attr(H5::H5Object& o, const std::string& key, const std::string& value) {
  constexpr size_t kMost = 16384;
  const std::string v = value.size() <= kMost ? value : cat(value.substr(0, kMost), "... (", value.size(), " bytes in all)");
  H5::StrType st(H5::PredType::C_S1, v.size() ? v.size() : 1);
  o.createAttribute(key, st, H5::DataSpace(H5S_SCALAR)).write(st, v);
}

}  // namespace

struct CaseReader::Impl {
  Impl(const std::string& p, const LoadOptions& o) : path(p), opt(o), f(open_h5(p)) {
    if (stat(path.c_str(), &opened) != 0) fail(path, ": cannot stat: ", std::strerror(errno));
  }
  // A file changed in place while it is read (truncated by another program: libhdf5 reads the
  // missing tokens as zeros, and the output was written, exit 0): checked after every read, so
  // that nothing built from it is written.
  void unchanged() const {
    struct stat now;
    if (stat(path.c_str(), &now) != 0 || now.st_ino != opened.st_ino || now.st_dev != opened.st_dev)
      return;  // removed, or replaced by another file: the open one still holds what it held
    if (now.st_size != opened.st_size || now.st_mtim.tv_sec != opened.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != opened.st_mtim.tv_nsec)
      fail(path, ": changed while mhc read it (", opened.st_size, " bytes when opened, ", now.st_size,
           " now); nothing written");
  }
  std::string path;
  LoadOptions opt;
  H5::H5File f;
  struct stat opened{};
  std::vector<TokenDataset> tok;
  std::set<std::string> warned;  // inputs whose rounding was reported already
};

CaseReader::CaseReader(const std::string& path, const LoadOptions& opt, bool outputs, const Case* inputs)
    : impl_(new Impl(path, opt)) {
  Impl& m = *impl_;
  ReadingFile reading(m.path);
  try {
    if (inputs && outputs && !link_exists(m.f, path, "/inputs")) {
      head_.prob = inputs->prob;
      for (auto& [name, t] : inputs->t)
        if (stage(name).group == Group::inputs && !per_token(stage(name))) head_.t[name] = t;
    } else {
      read_inputs_head(m.f, path, opt, head_, m.tok);
    }
    if (outputs) read_outputs_head(m.f, path, head_, m.tok);
  } catch (const H5::Exception& e) {
    fail(path, ": read error in ", e.getFuncName(), " (truncated or corrupt file?)");
  }
  m.unchanged();
}

CaseReader::~CaseReader() {
  ReadingFile reading(impl_->path);  // closing reads too (HDF5 flushes its metadata cache)
  impl_.reset();
}

Case CaseReader::chunk(int64_t t0, int64_t t1) { return read(t0, t1, false); }

Case CaseReader::read(int64_t t0, int64_t t1, bool whole) {
  Impl& m = *impl_;
  ReadingFile reading(m.path);
  const int64_t T = head_.prob.T();
  MHC_CHECK(0 <= t0 && t0 < t1 && t1 <= T, "token chunk ", t0, ":", t1, " of ", T);
  Case c;
  c.prob = head_.prob;
  if (!whole) c.prob.tokens = {t1 - t0};
  c.attrs = head_.attrs, c.stored_as = head_.stored_as, c.unknown = head_.unknown, c.misshapen = head_.misshapen;
  for (auto& [name, t] : head_.t)
    if (stage(name).group == Group::inputs) c.t[name] = t;
  const std::string range = T == t1 - t0 ? "" : cat("tokens ", t0, "..", t1 - 1, ": ");
  try {
    for (const TokenDataset& k : m.tok) {
      const std::string name = k.stage->name;
      if (!k.fits) {  // in c.misshapen; read only when the whole case is read
        if (whole) c.t[name] = read_all(k.data, m.path, k.path);
        continue;
      }
      Tensor raw = read_tokens(k.data, head_.prob.tokens.size(), t0, t1, m.path, k.path);
      if (whole) raw.shape = k.data.shape;
      if (k.stage->group != Group::inputs) {
        c.t[name] = std::move(raw);
        continue;
      }
      LoadOptions o = m.opt;
      o.quiet = o.quiet || m.warned.count(name);
      bool warned = false;
      c.t[name] = to_input_dtype(raw, k.stage->dtype, cat(m.path, ": ", k.path, ": ", range), o, &warned);
      if (warned) m.warned.insert(name);
    }
  } catch (const H5::Exception& e) {
    fail(m.path, ": read error in ", e.getFuncName(), " (", h5_cause(), ")");
  }
  m.unchanged();
  return c;
}

Case CaseReader::whole() {
  Case c = read(0, head_.prob.T(), true);
  for (auto& [name, t] : head_.t)
    if (stage(name).group != Group::inputs) c.t[name] = t;
  return c;
}

Case load_case(const std::string& path, const LoadOptions& opt, bool outputs) {
  return CaseReader(path, opt, outputs).whole();
}

bool has_inputs(const std::string& path) {
  try {
    H5::H5File f = open_h5(path);
    return link_exists(f, path, "/inputs");
  } catch (const std::exception&) {
    return true;
  }
}

void load_stages(const std::string& path, Case& c) {
  ReadingFile reading(path);
  H5::H5File f = open_h5(path);
  try {
    std::vector<TokenDataset> tok;
    read_outputs_head(f, path, c, tok);
    // only those in the schema's shape (the dump check names the rest): 11 stages declared [2^27]
    // in a 210 KB dump were read whole, 5.9 GB, before it refused them
    for (const TokenDataset& k : tok)
      if (k.fits) c.t[k.stage->name] = read_all(k.data, path, k.path);
  } catch (const H5::Exception& e) {
    fail(path, ": read error in ", e.getFuncName(), " (", h5_cause(), ")");
  }
  check_backward_has_gradients(path, c, c.has_gradients());  // the inputs of c, which no stage changes
}

// Was an internal error (exit 3) in diff, whose replays start from dh_in (review B, session 23).
void check_backward_has_gradients(const std::string& path, const Case& c, bool gradients) {
  if (gradients) return;
  for (const Stage& s : stage_table())
    if (s.group == Group::backward && (c.t.count(s.name) || c.misshapen.count(s.name)))
      fail(path, ": ", dataset_path(s), " is a backward stage, but the case has no gradients (",
           "/inputs/dh_in, dh_post, dh_res): a forward-only case has no backward");
}

namespace {

H5::DataType file_type(DType t) {
  return t == DType::bf16  ? H5::DataType(bf16_type())
         : t == DType::f32 ? H5::DataType(H5::PredType::IEEE_F32LE)
                           : H5::DataType(H5::PredType::IEEE_F64LE);
}

// An HDF5 failure while writing `path`: one line with the cause.
bool g_left_open = false;

[[noreturn]] void write_failed(const std::string& path, std::unique_ptr<H5::H5File>& f) {
  std::string cause = h5_cause();
  g_left_open = true;
  // After a failed write (EFBIG) libhdf5 1.10 fails closing the file again, printing from
  // the C++ destructor and crashing at shutdown: leave it open; the error ends the process.
  (void)f.release();
  fail(path, ": cannot write (", cause, ")");
}

// After a failed write libhdf5 1.10 cannot close a dataset (a full disk: the data it still
// holds cannot be written) and keeps its id, and HDF5's C++ destructor would retry and print a
// line for each dataset before mhc's own one-line error. The error ends the process, so such a
// dataset is kept open, as write_failed keeps the file: a copy holds a reference, and the
// destructor of ds then only drops its own.
void abandon(const H5::DataSet& ds) {
  static auto* kept = new std::vector<H5::DataSet>;  // reachable, so not a leak to LeakSanitizer
  kept->push_back(ds);
}

// The files mhc writes hold no object timestamps (HDF5 records creation and modification times
// by default): the same outputs are then the same bytes, run after run (review B, session 21).
H5::DSetCreatPropList untimed_dataset() {
  H5::DSetCreatPropList p;
  H5Pset_obj_track_times(p.getId(), false);
  return p;
}
std::unique_ptr<H5::H5File> create_file(const std::string& temp) {
  H5::FileCreatPropList p;  // the root group's
  H5Pset_obj_track_times(p.getId(), false);
  return std::make_unique<H5::H5File>(temp, H5F_ACC_EXCL, p);
}
void create_group(H5::H5File& f, const std::string& name) {
  const hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
  H5Pset_obj_track_times(gcpl, false);
  const hid_t id = H5Gcreate2(f.getId(), name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT);
  H5Pclose(gcpl);
  if (id < 0) throw H5::GroupIException("create_group", "H5Gcreate2 failed");
  H5Gclose(id);
}

// Dataset `path` of f (its groups created where missing) holding t.
void write_dataset(H5::H5File& f, const std::string& path, const Tensor& t) {
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  H5::DataSpace sp(int(dims.size()), dims.data());
  H5::DataType ft = file_type(t.dtype);
  for (size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1))
    if (!f.nameExists(path.substr(0, slash))) create_group(f, path.substr(0, slash));
  H5::DataSet ds = f.createDataSet(path, ft, sp, untimed_dataset());
  try {
    if (t.size()) ds.write(t.bytes.data(), mem_type(t.dtype));
    ds.close();  // where libhdf5 writes what it still holds: a full disk fails here
  } catch (const H5::Exception&) {
    abandon(ds);
    throw;
  }
}

// The descriptor of a file libhdf5 opened with its default (sec2) driver.
int vfd_descriptor(H5::H5File& f) {
  void* handle = nullptr;
  f.getVFDHandle(&handle);
  MHC_CHECK(handle, "no file descriptor from libhdf5");
  return *static_cast<int*>(handle);
}

// Writes a new HDF5 file through `fill` (an OutputFile: temporary file, then moved into place).
void write_atomically(const std::string& path, bool replace, const std::function<void(H5::H5File&)>& fill,
                      const std::function<void()>& before_commit = nullptr) {
  quiet_hdf5();
  OutputFile out(path, replace);
  std::unique_ptr<H5::H5File> f;
  try {
    f = create_file(out.temp_to_create());
    out.created(vfd_descriptor(*f));
    write_str_attr(*f, "producer", "mhc");
    write_str_attr(*f, "version", MHC_VERSION);
    fill(*f);
    f->close();
  } catch (const H5::Exception&) {
    write_failed(path, f);
  }
  if (before_commit) before_commit();
  out.commit();
}

}  // namespace

struct CaseWriter::Impl {
  Impl(const std::string& p, bool replace) : path(p), out(p, replace) {}
  std::string path;
  Problem prob;
  OutputFile out;
  std::unique_ptr<H5::H5File> f;
  std::map<std::string, H5::DataSet> made;

  // Runs `body`, turning an HDF5 failure into one line naming the output.
  template <class F> void guarded(F&& body) {
    try {
      body();
    } catch (const H5::Exception&) {
      for (auto& [name, ds] : made) abandon(ds);
      write_failed(path, f);
    }
  }
};

CaseWriter::CaseWriter(const std::string& path, const Case& head, bool replace) {
  quiet_hdf5();
  impl_ = std::make_unique<Impl>(path, replace);
  Impl& m = *impl_;
  m.prob = head.prob;
  m.guarded([&] {
    m.f = create_file(m.out.temp_to_create());
    m.out.created(vfd_descriptor(*m.f));
    H5::H5File& f = *m.f;
    write_str_attr(f, "producer", "mhc");
    write_str_attr(f, "version", MHC_VERSION);
    for (auto& [k, v] : head.attrs)
      if (k != "producer" && k != "version") write_str_attr(f, k, v);
    int schema = MHC_SCHEMA_VERSION;
    f.createAttribute("schema_version", H5::PredType::STD_I32LE, H5::DataSpace(H5S_SCALAR))
        .write(H5::PredType::NATIVE_INT, &schema);
    for (Group grp : {Group::inputs, Group::forward, Group::backward}) {
      create_group(f, cat("/", group_name(grp)));
      H5::Group g = f.openGroup(cat("/", group_name(grp)));
      if (grp == Group::inputs)
        for (auto [key, v] : {std::pair{"norm_eps", head.prob.norm_eps}, std::pair{"hc_eps", head.prob.hc_eps}})
          g.createAttribute(key, H5::PredType::IEEE_F64LE, H5::DataSpace(H5S_SCALAR))
              .write(H5::PredType::NATIVE_DOUBLE, &v);
    }
  });
}

CaseWriter::~CaseWriter() = default;

void CaseWriter::write(const Case& c, int64_t t0) {
  Impl& m = *impl_;
  const bool whole = t0 < 0;
  m.guarded([&] {
    for (const Stage& s : stage_table()) {
      if (!c.has(s.name)) continue;
      const Tensor& t = c.get(s.name);
      bool fresh = !m.made.count(s.name);
      if (!per_token(s) && !fresh) continue;
      if (fresh) {
        Shape full = whole ? t.shape : stage_shape(s, m.prob);
        std::vector<hsize_t> dims(full.begin(), full.end());
        m.made[s.name] =
            m.f->createDataSet(dataset_path(s), file_type(t.dtype), H5::DataSpace(int(dims.size()), dims.data()), untimed_dataset());
      }
      H5::DataSet& ds = m.made[s.name];
      if (!t.size()) continue;
      if (!per_token(s) || whole) {
        ds.write(t.bytes.data(), mem_type(t.dtype));
        continue;
      }
      Shape full = stage_shape(s, m.prob);
      const int64_t per = numel(full) / m.prob.T();
      H5::DataSpace file_space = ds.getSpace();
      token_boxes(full, m.prob.tokens.size(), t0, t0 + t.size() / per, [&](auto& start, auto& count, int64_t at, int64_t rows) {
        file_space.selectHyperslab(H5S_SELECT_SET, count.data(), start.data());
        hsize_t elements = hsize_t(rows * per);
        H5::DataSpace mem(1, &elements);
        ds.write(t.bytes.data() + size_t((at - t0) * per) * dtype_size(t.dtype), mem_type(t.dtype), mem, file_space);
      });
    }
  });
}

void CaseWriter::finish() {
  Impl& m = *impl_;
  if (!m.f) return;
  m.guarded([&] {
    // closed one by one, where libhdf5 writes what it still holds: a full disk fails here, and
    // the destructors (m.made.clear()) would only print that and go on
    for (auto& [name, ds] : m.made) ds.close();
    m.made.clear();
    m.f->close();
  });
  m.f.reset();
}

void CaseWriter::commit() {
  finish();
  impl_->out.commit();
}

bool write_left_file_open() { return g_left_open; }

void save_case(const std::string& path, const Case& c, bool replace, const std::function<void()>& announce) {
  CaseWriter w(path, c, replace);
  w.write(c, -1);
  w.finish();
  if (announce) announce();
  w.commit();
}

void save_tensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& datasets, bool replace,
                  const std::function<void()>& before_commit) {
  write_atomically(
      path, replace, [&](H5::H5File& f) {
        for (auto& [name, t] : datasets) write_dataset(f, name, t);
      },
      before_commit);
}

void save_text(const std::string& path, const std::string& text, bool replace, const std::function<void()>& before_commit) {
  OutputFile out(path, replace);
  FILE* f = fdopen(out.create(), "wb");
  if (!f) fail(path, ": cannot write: ", std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok) fail(path, ": cannot write: ", std::strerror(errno));
  if (before_commit) before_commit();
  out.commit();
}

// Statistics of a float dataset read in boxes of at most 2^22 elements: along the first
// axis d whose trailing axes fit, every index of the axes before it, steps along d.
Stats slab_stats(const H5::DataSet& ds, const Shape& shape, const std::string& file, const std::string& path) {
  constexpr int64_t kSlab = int64_t(1) << 22;
  StatsAccumulator acc;
  const size_t rank = shape.size();
  if (rank == 0 || numel(shape) == 0) {
    Tensor t(shape, DType::f64);
    if (t.size()) read_into(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, t.bytes.data(), file, path);
    acc.add(t);
    return acc.result();
  }
  size_t d = rank - 1;
  int64_t inner = 1;  // elements of the axes after d
  while (d > 0 && inner * shape[d] <= kSlab) inner *= shape[d--];
  const int64_t step = std::max<int64_t>(1, kSlab / inner);
  std::vector<hsize_t> start(rank, 0), count(rank, 1);
  for (size_t i = d + 1; i < rank; ++i) count[i] = hsize_t(shape[i]);
  H5::DataSpace file_space = ds.getSpace();
  for (bool more = true; more;) {
    for (int64_t k = 0; k < shape[d]; k += step) {
      start[d] = hsize_t(k), count[d] = hsize_t(std::min(step, shape[d] - k));
      file_space.selectHyperslab(H5S_SELECT_SET, count.data(), start.data());
      H5::DataSpace mem(int(rank), count.data());
      Tensor t(Shape(count.begin(), count.end()), DType::f64);
      read_into(ds, H5T_NATIVE_DOUBLE, mem.getId(), file_space.getId(), t.bytes.data(), file, path);
      acc.add(t);
    }
    more = false;  // next index of the axes before d
    for (size_t i = d; i-- > 0;) {
      if (++start[i] < hsize_t(shape[i])) {
        more = true;
        break;
      }
      start[i] = 0;
    }
  }
  return acc.result();
}

// The listing of dataset n of the open file (path: its name), into d.
void list_one(const H5::H5File& f, const std::string& path, const std::string& n, DatasetInfo& d) {
  H5::DataSet ds = open_dataset(f, path, n);
  d.shape = dataset_shape(ds, path, n, false);
  d.is_float = ds.getTypeClass() == H5T_FLOAT;
  if (!d.is_float) {
    d.type = class_name(ds.getTypeClass());
    return;
  }
  d.type = float_type_name(ds.getFloatType());
  H5D_space_status_t status;
  d.written = H5Dget_space_status(ds.getId(), &status) < 0 || status != H5D_SPACE_STATUS_NOT_ALLOCATED ||
              ds.getStorageSize() > 0;
  // partly written (chunks missing, read as fill values): 20 such datasets of 2^28 elements
  // in a 57 KB file took 72 s
  d.partly = partly_written(ds);
  d.has_stats = d.written && !d.partly && numel(d.shape) <= kInspectMaxElements;
  if (d.has_stats) {
    check_storage(ds, d.shape, path, n);
    d.stats = slab_stats(ds, d.shape, path, n);
  }
}

std::vector<DatasetInfo> list_datasets(const std::string& path, std::map<std::string, std::string>* attrs) {
  ReadingFile reading(path);
  H5::H5File f = open_h5(path);
  std::vector<DatasetInfo> out;
  try {
    std::vector<std::string> paths = dataset_paths(f, path);  // first: a failed read can leave a partial walk "successful"
    if (attrs) *attrs = read_root_attrs(f);
    for (auto& n : paths) {
      DatasetInfo d;
      d.path = n;
      try {  // one dataset that cannot be read is listed as such: the rest of the file still is
        list_one(f, path, n, d);
      } catch (const UserError& e) {
        const std::string why = e.what(), at = cat(path, ": ", n, ": ");
        d.unread = why.rfind(at, 0) == 0 ? why.substr(at.size()) : why;
      }
      out.push_back(std::move(d));
    }
  } catch (const H5::Exception& e) {
    fail(path, ": read error in ", e.getFuncName(), " (", h5_cause(), ")");
  }
  return out;
}

void check_memory(const std::string& where, const Problem& p, double need) {
  if (need > double(memory_limit()))
    fail(where, p.str(), " needs about ", need / 1e9, " GB for this command, more than the memory limit of ",
         double(memory_limit()) / 1e9, " GB (MHC_MAX_MEMORY=BYTES to change it)");
}

namespace {

// Bytes the process may still allocate under a limit of its own: ulimit -v and -d, less what it
// maps already (an over-estimate of the data it holds), and a cgroup v2 memory.max, less the
// cgroup's anonymous memory (its page cache is given back on demand); UINT64_MAX where there is
// none. (MemAvailable alone let an allocation under `ulimit -v` fail as an internal error:
// review B, session 21.)
uint64_t process_headroom() {
  uint64_t room = UINT64_MAX, pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  const uint64_t mapped = pages * uint64_t(sysconf(_SC_PAGE_SIZE));
  for (int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    rlimit r{};
    if (getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
      room = std::min<uint64_t>(room, r.rlim_cur > mapped ? r.rlim_cur - mapped : 0);
  }
  uint64_t max = 0, anon = 0;  // "max" (no limit) reads as no number
  if (std::ifstream("/sys/fs/cgroup/memory.max") >> max) {
    std::ifstream stat("/sys/fs/cgroup/memory.stat");
    std::string key;
    for (uint64_t v = 0; stat >> key >> v;)
      if (key == "anon") anon = v;
    room = std::min(room, max > anon ? max - anon : 0);
  }
  return room;
}

}  // namespace

uint64_t memory_limit() {
  static const uint64_t limit = [] {
    if (const char* env = std::getenv("MHC_MAX_MEMORY")) {  // digits only: strtoull took -1 for 2^64 - 1
      const std::string text = env;
      errno = 0;
      const unsigned long long v = std::strtoull(env, nullptr, 10);
      if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos && errno != ERANGE && v > 0)
        return uint64_t(v);
      fail("MHC_MAX_MEMORY=", env, ": expected a number of bytes (digits, at least 1)");
    }
    std::ifstream f("/proc/meminfo");
    std::string key;
    uint64_t kb = 0, available = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGE_SIZE));
    while (f >> key >> kb)
      if (key == "MemAvailable:") available = kb * 1024;
    return std::min(available, process_headroom());
  }();
  return limit;
}

}  // namespace mhc

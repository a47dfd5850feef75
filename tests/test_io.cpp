// test_io.cpp — HDF5 round trips of every dtype, bf16 edge values, and what h5py sees.
#include <doctest/doctest.h>

#include <cstring>

#include "h5io.h"
#include "support.h"

using namespace mhc;

namespace {

Tensor bf16_tensor(const std::vector<uint16_t>& bits) {
  Tensor t({int64_t(bits.size())}, DType::bf16);
  std::memcpy(t.bytes.data(), bits.data(), bits.size() * 2);
  return t;
}

// ±0, smallest subnormal ±, largest subnormal, smallest normal, 1, largest finite ±, ±inf, NaN
const std::vector<uint16_t> kEdges = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x3f80,
                                      0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0};

}  // namespace

TEST_SUITE("hdf5") {
  TEST_CASE("round trip of bf16, float32 and float64 stages, edge values included") {
    std::string dir = test::tmpdir("roundtrip");
    Case c = test::golden(parse_shape("2,3,4,5"), 4);
    c.t["h_in"] = bf16_tensor(kEdges);
    Tensor f32({6}, DType::f32), f64({6}, DType::f64);
    const double vals[6] = {0.0, -0.0, 1e-45, -3.4028234663852886e38, INFINITY, NAN};
    for (int i = 0; i < 6; ++i) f32.data<float>()[i] = float(vals[i]), f64.data<double>()[i] = vals[i] * 1.0000001;
    c.t["h_mix"] = f32;
    c.t["dh_pre"] = f64;
    save_case(dir + "/rt.h5", c);
    Case r = load_case(dir + "/rt.h5", LoadOptions{}, true);
    CHECK(r.prob.tokens == Shape{2, 3});
    for (auto& [name, t] : c.t) {
      CAPTURE(name);
      REQUIRE(r.has(name));
      CHECK(r.get(name).dtype == t.dtype);
      CHECK(r.get(name).shape == t.shape);
      CHECK(r.get(name).bytes == t.bytes);
    }
    CHECK(r.attrs.at("producer") == "mhc");
  }

  TEST_CASE("h5py reads mhc's bf16 datasets as float32, exactly") {
    std::string dir = test::tmpdir("h5py");
    Case c = test::golden(parse_shape("3,2,4"), 4);
    c.t["h_in"] = bf16_tensor(kEdges);
    save_case(dir + "/b.h5", c);
    auto r = test::sh(std::string(MHC_PYTHON) + " -c \"import h5py,numpy as np; d=h5py.File('" + dir +
                      "/b.h5')['/forward/h_in']; a=d[()]; print(a.dtype, ' '.join('%08x' % v for v in "
                      "a.astype(np.float32).view(np.uint32)))\"");
    REQUIRE(r.rc == 0);
    std::string want = "float32";
    for (uint16_t b : kEdges) {
      char hex[16];
      std::snprintf(hex, sizeof hex, " %08x", unsigned(b) << 16);
      want += hex;
    }
    // every value exact; NaN stays NaN (HDF5's conversion does not keep the payload)
    std::string nan_any = r.out.substr(0, r.out.size() - 10), last = r.out.substr(r.out.size() - 9, 8);
    CHECK(nan_any == want.substr(0, want.size() - 9));
    CHECK(((std::stoul(last, nullptr, 16) & 0x7f800000u) == 0x7f800000u && (std::stoul(last, nullptr, 16) & 0x7fffffu)));
  }

  TEST_CASE("inputs given as float32/float64 are rounded to bf16 with a count, or refused with --strict") {
    std::string dir = test::tmpdir("rounding");
    Case c = generate_case(parse_shape("2,2,3"), 1, false);
    c.t["x"] = convert(c.get("x"), DType::f64);
    c.t["x"].set(0, 1.0 + 0x1p-9);  // not a bf16 value
    c.t["x"].set(1, 0.1);
    save_case(dir + "/in.h5", c);
    auto ok = test::sh(test::mhc("run -q " + dir + "/in.h5 " + dir + "/out.h5"));
    CHECK(ok.rc == 0);
    CHECK(ok.err.find("/inputs/x: 2 of 12 values rounded to bfloat16") != std::string::npos);
    Case out = load_case(dir + "/out.h5", LoadOptions{}, true);
    CHECK(out.get("x").dtype == DType::bf16);
    CHECK(out.get("x").at(0) == 1.0);
    auto strict = test::sh(test::mhc("run --strict " + dir + "/in.h5 " + dir + "/out2.h5"));
    CHECK(strict.rc == 2);
    CHECK(strict.err.find("/inputs/x: 2 of 12 values are not exactly representable in bfloat16") != std::string::npos);
    CHECK(!std::filesystem::exists(dir + "/out2.h5"));
  }

  TEST_CASE("storage HDF5 would block on or recurse through is refused by name; links to FIFOs are not followed") {
    const std::string dir = test::tmpdir("hostile_storage");
    save_case(dir + "/in.h5", test::golden(parse_shape("8,4,8"), 5, Precision::fp32, false).inputs_only());
    REQUIRE(test::sh("rm -f " + dir + "/fifo && mkfifo " + dir + "/fifo").rc == 0);
    // /inputs/x: an external link into the FIFO (by its name, or by a missing absolute name with
    // its last component); raw data stored externally in it; a virtual
    // dataset whose source is itself
    const std::string py = cat(MHC_PYTHON, " -c \"import h5py, shutil, numpy as np\n"
                               "for k in ('link', 'abslink', 'raw', 'vds'):\n"
                               "    shutil.copy('", dir, "/in.h5', '", dir, "/' + k + '.h5')\n"
                               "    f = h5py.File('", dir, "/' + k + '.h5', 'r+'); del f['inputs/x']\n"
                               "    if k == 'link': f['inputs/x'] = h5py.ExternalLink('", dir, "/fifo', '/x')\n"
                               "    if k == 'abslink': f['inputs/x'] = h5py.ExternalLink('/nonexistent/dir/fifo', '/x')\n"
                               "    if k == 'raw': f.create_dataset('inputs/x', (8, 4, 8), np.float32, external=[('", dir,
                               "/fifo', 0, 1024)])\n"
                               "    if k == 'vds':\n"
                               "        l = h5py.VirtualLayout((8, 4, 8), np.float32); l[:] = h5py.VirtualSource('.', '/inputs/x', (8, 4, 8))\n"
                               "        f.create_virtual_dataset('inputs/x', l)\n"
                               "    f.close()\n"
                               // raw data stored in 'fifo', relative: HDF5_EXTFILE_PREFIX=${ORIGIN} reads it beside the file
                               "shutil.copy('", dir, "/in.h5', '", dir, "/rawprefix.h5')\n"
                               "f = h5py.File('", dir, "/rawprefix.h5', 'r+'); del f['inputs/x']\n"
                               "f.create_dataset('inputs/x', (8, 4, 8), np.float32, external=[('fifo', 0, 1024)]); f.close()\n"
                               // a virtual dataset whose unlimited mapping libhdf5 resolves, opening its source, when
                               // asked for the dataspace
                               "from h5py import h5s, h5p, h5d, h5t\n"
                               "shutil.copy('", dir, "/in.h5', '", dir, "/vdsfifo.h5')\n"
                               "f = h5py.File('", dir, "/vdsfifo.h5', 'r+'); del f['inputs/x']\n"
                               "v, u = [h5s.create_simple((8, 4, 8), (h5s.UNLIMITED, 4, 8)) for _ in range(2)]\n"
                               "[q.select_hyperslab((0, 0, 0), (h5s.UNLIMITED, 1, 1), (1, 1, 1), (1, 4, 8)) for q in (v, u)]\n"
                               "dcpl = h5p.create(h5p.DATASET_CREATE); dcpl.set_virtual(v, b'", dir, "/fifo', b'/x', u)\n"
                               "h5d.create(f['inputs'].id, b'x', h5t.IEEE_F32LE, v, dcpl=dcpl); f.close()\"");
    REQUIRE(test::sh(py).rc == 0);
    // abslink: a missing absolute name, whose last component HDF5 then tries beside the linking file
    for (auto [k, why] : {std::pair{"link", "an external link into "}, std::pair{"abslink", "an external link into "},
                          std::pair{"raw", "stored externally in "}, std::pair{"rawprefix", "stored externally in "},
                          std::pair{"vds", "a virtual dataset"}, std::pair{"vdsfifo", "a virtual dataset"}}) {
      CAPTURE(k);
      const std::string env = k == std::string("rawprefix") ? "HDF5_EXTFILE_PREFIX='${ORIGIN}' " : "";
      auto r = test::sh("timeout 20 env " + env + test::mhc(cat("run -q ", dir, "/", k, ".h5 ", dir, "/out.h5")));
      CHECK(r.rc == 2);
      CHECK(r.err.find(cat(dir, "/", k, ".h5: /inputs/x: ")) != std::string::npos);
      CHECK(r.err.find(why) != std::string::npos);
      CHECK(test::sh(cat("ls -a ", dir, " | grep -c tmp")).out == "0\n");
    }
    // inspect lists such a dataset as not read and the rest of the file (it refused the whole
    // file over one user dataset that run and diff ignore; review B, session 19)
    auto listed = test::sh("timeout 20 " + test::mhc(cat("inspect ", dir, "/vds.h5")));
    CHECK(listed.rc == 0);
    CHECK(listed.out.find("(not read: a virtual dataset") != std::string::npos);
    CHECK(listed.out.find("/inputs/phi") != std::string::npos);
  }

  TEST_CASE("/inputs as an external link into a FIFO: refused, not waited on (review B, session 19)") {
    const std::string dir = test::tmpdir("inputs_fifo");
    save_case(dir + "/in.h5", test::golden(parse_shape("8,4,8"), 5, Precision::fp32, false).inputs_only());
    REQUIRE(test::sh(cat("rm -f ", dir, "/fifo && mkfifo ", dir, "/fifo && ", MHC_PYTHON, " -c \"import h5py\n",
                         "f = h5py.File('", dir, "/in.h5', 'r+'); del f['inputs']; f['inputs'] = h5py.ExternalLink('", dir,
                         "/fifo', '/inputs'); f.close()\"")).rc == 0);
    CHECK(test::sh("timeout 20 " + test::mhc("inspect " + dir + "/in.h5")).rc == 0);  // its walk does not follow external links
    for (const char* cmd : {"run -q IN OUT", "diff IN cpu", "diff cpu cpu:fp64 --input IN"}) {
      CAPTURE(cmd);
      std::string c = cmd;
      c.replace(c.find("IN"), 2, dir + "/in.h5");
      if (size_t o = c.find("OUT"); o != std::string::npos) c.replace(o, 3, dir + "/out.h5");
      auto r = test::sh("timeout 20 " + test::mhc(c));
      CHECK(r.rc == 2);
      CHECK(r.err.find("an external link into " + dir + "/fifo") != std::string::npos);
    }
    CHECK(!std::filesystem::exists(dir + "/out.h5"));
  }

  TEST_CASE("external raw storage: a relative name below the working directory, holding every byte it declares") {
    // an absolute name or one above the directory would copy any file (/etc/passwd) into the
    // outputs; a file shorter than its segment read as zeros, silently (review B, session 19)
    const std::string dir = test::tmpdir("external_raw");
    save_case(dir + "/in.h5", test::golden(parse_shape("8,4,8"), 5, Precision::fp32, false).inputs_only());
    // through a symbolic link beside the case (./link.bin -> /etc/hostname, ./etc -> /etc), the
    // same (review B, session 20); a link that stays in the directory is read (data.bin: 1, 2, 3 as
    // float32; random bytes were NaN now and then)
    REQUIRE(test::sh(cat("cd ", dir, " && head -c 10 /dev/urandom > short.bin && ",
                         "printf '\\000\\000\\200\\077\\000\\000\\000\\100\\000\\000\\100\\100' > data.bin && ",
                         "ln -s /etc/hostname link.bin && ln -s /etc etc && ln -s data.bin inside.bin && ", MHC_PYTHON,
                         " -c \"import h5py, shutil\n",
                         "for k, name, size in (('abs', '/etc/hostname', 12), ('up', '../x.bin', 12), ('short', 'short.bin', 12),\n",
                         "                      ('link', 'link.bin', 12), ('dirlink', 'etc/hostname', 12), ('inside', 'inside.bin', 12)):\n",
                         "    shutil.copy('in.h5', k + '.h5'); f = h5py.File(k + '.h5', 'r+'); del f['inputs/alpha']\n",
                         "    f.create_dataset('inputs/alpha', (3,), 'f4', external=[(name, 0, size)]); f.close()\"")).rc == 0);
    for (auto [k, why] : {std::pair{"abs", "/etc/hostname (not read: external raw storage must be a relative name"},
                          std::pair{"up", "../x.bin (not read: external raw storage must be a relative name"},
                          std::pair{"short", "short.bin, which holds 10 bytes, fewer than the 12 this segment reads"},
                          std::pair{"link", "link.bin (not read: through a symbolic link it leads to /etc/hostname, outside the working directory"},
                          std::pair{"dirlink", "etc/hostname (not read: through a symbolic link it leads to /etc/hostname, outside"}}) {
      CAPTURE(k);
      auto r = test::sh(cat("cd ", dir, " && ", test::mhc(cat("run -q ", k, ".h5 out.h5"))));
      CHECK(r.rc == 2);
      CHECK(r.err.find(cat(k, ".h5: /inputs/alpha: stored externally in ")) != std::string::npos);
      CHECK(r.err.find(why) != std::string::npos);
      CHECK(!std::filesystem::exists(dir + "/out.h5"));
    }
    CHECK(test::sh(cat("cd ", dir, " && ", test::mhc("run -q inside.h5 out.h5"))).rc == 0);
  }

  TEST_CASE("x stored as one gzip chunk of 2^20 tokens: inflated once, not once for every block of tokens") {
    // libhdf5's default chunk cache (1 MiB) cannot hold the 16 MiB chunk: the diff's 4096 blocks
    // each inflated it again (over 100 s here; 1.5 s since the chunk cache holds a row of chunks)
    const std::string dir = test::tmpdir("chunk_cache"), f = dir + "/one_chunk.h5";
    REQUIRE(test::sh(cat(MHC_PYTHON, " -c \"import h5py, numpy as np\n"
                         "T = 2 ** 20\n"
                         "t = h5py.h5t.IEEE_F32LE.copy(); t.set_fields(15, 7, 8, 0, 7); t.set_precision(16); t.set_size(2); "
                         "t.set_ebias(127)\n"
                         "with h5py.File('", f, "', 'w') as f:\n"
                         "    g = f.create_group('inputs')\n"
                         "    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE); dcpl.set_chunk((T, 1, 8)); dcpl.set_deflate(6)\n"
                         "    x = h5py.h5d.create(g.id, b'x', t, h5py.h5s.create_simple((T, 1, 8)), dcpl=dcpl)\n"
                         "    x.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ones((T, 1, 8), np.float32), mtype=h5py.h5t.NATIVE_FLOAT)\n"
                         "    g['phi'] = np.full((3, 8), 0.1, np.float32); g['alpha'] = np.ones(3, np.float32); "
                         "g['bias'] = np.zeros(3, np.float32)\n"
                         "    f.create_group('forward').create_dataset('inv_rms', data=np.full(T, 2, np.float32), chunks=(T,), "
                         "compression='gzip')\"")).rc == 0);
    // one thread: with n*D = 8 each block's work is a few parallel regions of almost nothing, and
    // on a loaded machine (a clean-clone CI beside other jobs) libgomp's spinning took 60 s
    auto r = test::sh("timeout 60 env OMP_NUM_THREADS=1 " + test::mhc("diff " + f + " cpu:fp64 --require inv_rms"));
    CAPTURE(r.err);
    CHECK(r.rc == 1);  // inv_rms of all-ones x is about 1, not the dump's 2: diverged, and in time
  }

  TEST_CASE("a file changed in place between two reads of its tokens: an error naming it, not zeros (review B, session 19)") {
    const std::string dir = test::tmpdir("changed"), f = dir + "/in.h5";
    save_case(f, test::golden(parse_shape("8,4,16"), 11, Precision::fp32, false).inputs_only());
    const auto size = std::filesystem::file_size(f);
    for (bool shrink : {false, true}) {
      CAPTURE(shrink);
      CaseReader r(f, LoadOptions{}, false);
      CHECK(r.chunk(0, 4).get("x").size() == 4 * 4 * 16);
      // another program appends to the file (its data intact) or truncates it (the tokens after
      // the cut would read as zeros)
      std::filesystem::resize_file(f, shrink ? size - 1 : size + 1);
      bool refused = false;
      try {
        r.chunk(4, 8);
      } catch (const UserError& e) {
        refused = true;
        CHECK(std::string(e.what()).find(f + ": ") == 0);
        if (!shrink) CHECK(std::string(e.what()).find("changed while mhc read it") != std::string::npos);
      }
      CHECK(refused);
      std::filesystem::resize_file(f, size);
    }
    // a file replaced by another (a rename over it) is no change: the open one is still read whole
    CaseReader r(f, LoadOptions{}, false);
    save_case(dir + "/new.h5", test::golden(parse_shape("8,4,16"), 12, Precision::fp32, false).inputs_only());
    std::filesystem::rename(dir + "/new.h5", f);
    CHECK(r.chunk(0, 8).get("x").size() == 8 * 4 * 16);
  }

  TEST_CASE("an eps attribute above 1: exit 2 before any work") {
    const std::string dir = test::tmpdir("eps_range");
    save_case(dir + "/in.h5", test::golden(parse_shape("8,4,8"), 7, Precision::fp32, false).inputs_only());
    REQUIRE(test::sh(cat(MHC_PYTHON, " -c \"import h5py, shutil\n"
                         "shutil.copy('", dir, "/in.h5', '", dir, "/eps.h5')\n"
                         "h5py.File('", dir, "/eps.h5', 'r+')['inputs'].attrs['hc_eps'] = 1e40\"")).rc == 0);
    auto eps = test::sh(test::mhc(cat("run -q ", dir, "/eps.h5 ", dir, "/out.h5")));
    CHECK(eps.rc == 2);
    CHECK(eps.err.find("attribute hc_eps = 1e+40: expected a value in [0, 1]") != std::string::npos);
  }

  TEST_CASE("outputs: through a symlink the target is written and the link kept; diff never writes over its inputs") {
    const std::string dir = test::tmpdir("output_paths");
    save_case(dir + "/in.h5", test::golden(parse_shape("8,4,8"), 6));
    REQUIRE(test::sh(cat("mkdir -p ", dir, "/real ", dir, "/links && rm -f ", dir, "/links/out.h5 && echo old > ", dir,
                         "/real/target.h5 && ln -s ../real/target.h5 ", dir, "/links/out.h5")).rc == 0);
    CHECK(test::sh(test::mhc(cat("gen --force --shape 4,2,4 ", dir, "/links/out.h5"))).rc == 0);
    CHECK(test::sh(cat("test -L ", dir, "/links/out.h5")).rc == 0);
    CHECK(load_case(dir + "/real/target.h5", LoadOptions{}, false).prob.T() == 4);
    const std::string in = dir + "/in.h5";
    for (const std::string& opts : {"--input " + in + " --dump-diff " + in, "--input " + in + " --report " + in,
                                    "--dump-diff " + dir + "/x.h5 --report " + dir + "/x.h5"}) {
      CAPTURE(opts);
      auto r = test::sh(test::mhc("diff cpu cpu:fp64 " + opts));
      CHECK(r.rc == 2);
      CHECK(load_case(in, LoadOptions{}, true).has("dx"));  // still the case it was
    }
  }
}

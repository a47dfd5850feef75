// cmd_gen.cpp — mhc gen: write a seeded random input case.
#include <iostream>
#include <memory>

#include "commands.h"
#include "generate.h"
#include "h5io.h"

namespace mhc {

void add_gen(CLI::App& app, int& rc) {
  struct Opts {
    std::string shape = "64,4,256", out;
    uint64_t seed = 0;
    bool forward_only = false, force = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("gen", "Write a seeded random input case (HDF5, /inputs only)");
  sub->add_option("--shape", o->shape, "T,n,D or B,S,n,D")->capture_default_str();
  sub->add_option("--seed", o->seed, "random seed")->check(kSeed)->capture_default_str();
  sub->add_flag("--forward-only", o->forward_only, "omit the upstream gradients dh_in, dh_post, dh_res");
  sub->add_flag("--force", o->force, "replace an existing output file");
  sub->add_option("out", o->out, "output file")->required();
  sub->footer("Example:\n  mhc gen --shape 2,128,4,1024 --seed 7 in.h5");
  sub->callback([o, &rc] {
    Problem p = parse_shape(o->shape);
    check_case_memory(cat("--shape ", o->shape, ": "), p, Holds::inputs);
    check_output_path(o->out, "", o->force);
    Case c = generate_case(p, o->seed, !o->forward_only);
    c.attrs["generator"] = cat("mhc gen --shape ", o->shape, " --seed ", o->seed);
    // printed once the file is written, before it is moved into place: where stdout cannot take
    // it, the command fails and leaves no file
    save_case(o->out, c, o->force, [&] {
      std::cout << "wrote " << o->out << ": " << p.str() << ", seed " << o->seed
                << (o->forward_only ? ", forward only\n" : ", with gradients\n");
      flush_stdout();
    });
    rc = 0;
  });
}

}  // namespace mhc

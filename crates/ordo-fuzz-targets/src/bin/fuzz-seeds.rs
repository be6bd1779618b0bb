//! Writes every fuzz target's seeds into DIR/NAME/ (the campaign's starting corpus), one file
//! per seed, named by its content so that running it twice adds nothing.
//!
//!   fuzz-seeds DIR

fn main() {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: fuzz-seeds DIR");
        std::process::exit(2);
    };
    for t in ordo_fuzz_targets::TARGETS {
        let folder = std::path::Path::new(&dir).join(t.name);
        std::fs::create_dir_all(&folder).expect("creating the corpus folder");
        for seed in (t.seeds)() {
            let name = format!("seed-{:016x}", ordo_fuzz_targets::short::name_of(&seed));
            std::fs::write(folder.join(name), &seed).expect("writing a seed");
        }
    }
}

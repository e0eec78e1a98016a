//! Random inference problems (see `rocannl_shape_fuzz::plan`): the solver must answer `Ok` or
//! `Err` without panicking or looping, and every successful problem must have closed shapes and
//! in-bounds projections.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rocannl_shape_fuzz::plan::Plan;
use rocannl_shape_fuzz::replay::check;

fuzz_target!(|plan: Plan| check(&plan));

//! What each kernel of the schedule looks like, as snapshots of the scheduled program.

use super::*;

#[test]
fn snapshot_packed_transpose() {
    let case = abt(8, 4, 16, Prec::F32, true);
    expect![[r#"
        # y abt_8x4x16_f32_true
        for v3 in 0..1 par {
          for v5 in 0..16 {
            for v6 in 0..4 {
              n3[v6, 16*v3 + v5] := n1[16*v3 + v5, v6]
            }
          }
        }
        for v7 in 0..2 par {
          t1 := n0[4*v7, 0]
          t2 := n0[4*v7, 1]
          t3 := n0[4*v7, 2]
          t4 := n0[4*v7, 3]
          t5 := n0[4*v7 + 1, 0]
          t6 := n0[4*v7 + 1, 1]
          t7 := n0[4*v7 + 1, 2]
          t8 := n0[4*v7 + 1, 3]
          t9 := n0[4*v7 + 2, 0]
          t10 := n0[4*v7 + 2, 1]
          t11 := n0[4*v7 + 2, 2]
          t12 := n0[4*v7 + 2, 3]
          t13 := n0[4*v7 + 3, 0]
          t14 := n0[4*v7 + 3, 1]
          t15 := n0[4*v7 + 3, 2]
          t16 := n0[4*v7 + 3, 3]
          for v12 in 0..16 par {
            t17 := n3[3, v12]
            t18 := n3[2, v12]
            t19 := n3[1, v12]
            t20 := n3[0, v12]
            n2[4*v7, v12] := fma(t4, t17, fma(t3, t18, fma(t2, t19, fma(t1, t20, 0))))
            n2[4*v7 + 1, v12] := fma(t8, t17, fma(t7, t18, fma(t6, t19, fma(t5, t20, 0))))
            n2[4*v7 + 2, v12] := fma(t12, t17, fma(t11, t18, fma(t10, t19, fma(t9, t20, 0))))
            n2[4*v7 + 3, v12] := fma(t16, t17, fma(t15, t18, fma(t14, t19, fma(t13, t20, 0))))
          }
        }
    "#]]
    .assert_eq(&scheduled(&case));
}

#[test]
fn snapshot_lanes() {
    let case = abt(2, 1030, 2, Prec::F32, true);
    expect![[r#"
        # y abt_2x1030x2_f32_true
        for v4 in 0..1 par {
          for v5 in 0..16 par {
            n3[0, v5] := 0
            n3[1, v5] := 0
            n3[2, v5] := 0
            n3[3, v5] := 0
          }
          for v6 in 0..64 {
            for v7 in 0..16 par {
              n3[0, v7] := fma(n0[2*v4, 16*v6 + v7], n1[0, 16*v6 + v7], n3[0, v7])
              n3[1, v7] := fma(n0[2*v4 + 1, 16*v6 + v7], n1[0, 16*v6 + v7], n3[1, v7])
              n3[2, v7] := fma(n0[2*v4, 16*v6 + v7], n1[1, 16*v6 + v7], n3[2, v7])
              n3[3, v7] := fma(n0[2*v4 + 1, 16*v6 + v7], n1[1, 16*v6 + v7], n3[3, v7])
            }
          }
          for v8 in 0..6 par {
            n3[0, v8] := fma(n0[2*v4, v8 + 1024], n1[0, v8 + 1024], n3[0, v8])
            n3[1, v8] := fma(n0[2*v4 + 1, v8 + 1024], n1[0, v8 + 1024], n3[1, v8])
            n3[2, v8] := fma(n0[2*v4, v8 + 1024], n1[1, v8 + 1024], n3[2, v8])
            n3[3, v8] := fma(n0[2*v4 + 1, v8 + 1024], n1[1, v8 + 1024], n3[3, v8])
          }
          t1 := 0
          for v9 in 0..16 {
            t1 := add(t1, n3[0, v9])
          }
          n2[2*v4, 0] := t1
          t2 := 0
          for v10 in 0..16 {
            t2 := add(t2, n3[1, v10])
          }
          n2[2*v4 + 1, 0] := t2
          t3 := 0
          for v11 in 0..16 {
            t3 := add(t3, n3[2, v11])
          }
          n2[2*v4, 1] := t3
          t4 := 0
          for v12 in 0..16 {
            t4 := add(t4, n3[3, v12])
          }
          n2[2*v4 + 1, 1] := t4
        }
    "#]]
    .assert_eq(&scheduled(&case));
}

#[test]
fn snapshot_guarded_convolution() {
    let case = conv2d(4, 4, 2, 16, 1, 1, Prec::F32);
    expect![[r#"
        # y conv_b4_hw4_c2_d16_s1_p1_f32
        for v0 in 0..4 par {
          for v1 in 0..4 par {
            for v2 in 0..4 par {
              for v3 in 0..16 par {
                n2[v0, v1, v2, v3] := 0
              }
            }
          }
        }
        for v4 in 0..3 par {
          for v5 in 0..3 {
            for v9 in 0..16 {
              for v10 in 0..2 {
                n3[v4, v5, v10, v9] := n1[v9, v4, v5, v10]
              }
            }
          }
        }
        for v11 in 0..1 par {
          for v1 in 0..4 {
            for v2 in 0..4 {
              for v4 in 0..3 {
                for v5 in 0..3 {
                  if 0 <= v1 + v4 - 1 < 4 && 0 <= v2 + v5 - 1 < 4 {
                    t1 := n0[4*v11, v1 + v4 - 1, v2 + v5 - 1, 0]
                    t2 := n0[4*v11, v1 + v4 - 1, v2 + v5 - 1, 1]
                    t3 := n0[4*v11 + 1, v1 + v4 - 1, v2 + v5 - 1, 0]
                    t4 := n0[4*v11 + 1, v1 + v4 - 1, v2 + v5 - 1, 1]
                    t5 := n0[4*v11 + 2, v1 + v4 - 1, v2 + v5 - 1, 0]
                    t6 := n0[4*v11 + 2, v1 + v4 - 1, v2 + v5 - 1, 1]
                    t7 := n0[4*v11 + 3, v1 + v4 - 1, v2 + v5 - 1, 0]
                    t8 := n0[4*v11 + 3, v1 + v4 - 1, v2 + v5 - 1, 1]
                    for v16 in 0..16 par {
                      t9 := n3[v4, v5, 1, v16]
                      t10 := n3[v4, v5, 0, v16]
                      n2[4*v11, v1, v2, v16] := fma(t2, t9, fma(t1, t10, n2[4*v11, v1, v2, v16]))
                      n2[4*v11 + 1, v1, v2, v16] := fma(t4, t9, fma(t3, t10, n2[4*v11 + 1, v1, v2, v16]))
                      n2[4*v11 + 2, v1, v2, v16] := fma(t6, t9, fma(t5, t10, n2[4*v11 + 2, v1, v2, v16]))
                      n2[4*v11 + 3, v1, v2, v16] := fma(t8, t9, fma(t7, t10, n2[4*v11 + 3, v1, v2, v16]))
                    }
                  }
                }
              }
            }
          }
        }
    "#]].assert_eq(&scheduled(&case));
}

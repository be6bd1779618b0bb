//! eBPF instructions, as the kernel takes them (`struct bpf_insn`, the kernel's
//! Documentation/bpf/standardization/instruction-set.rst), and an assembler with labels for
//! the few dozen that [`super::filter`] writes: Ordo loads its XDP program from instructions
//! built here, so the build needs no BPF compiler and ships no object of unknown origin.

use std::collections::HashMap;

/// One instruction: opcode, destination and source registers, offset, immediate.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Insn {
    pub code: u8,
    /// Destination register in the low nibble, source in the high one.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

/// A register: r0 return value, r1-r5 arguments (clobbered by calls), r6-r9 kept across
/// calls, r10 the read-only frame pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reg(pub u8);

pub const R0: Reg = Reg(0);
pub const R1: Reg = Reg(1);
pub const R2: Reg = Reg(2);
pub const R3: Reg = Reg(3);
pub const R4: Reg = Reg(4);
pub const R5: Reg = Reg(5);
pub const R6: Reg = Reg(6);
pub const R7: Reg = Reg(7);
pub const R8: Reg = Reg(8);
pub const R9: Reg = Reg(9);
pub const R10: Reg = Reg(10);

// Classes.
const LDX: u8 = 0x01;
const STX: u8 = 0x03;
const ALU: u8 = 0x04;
const ALU64: u8 = 0x07;
const JMP: u8 = 0x05;
const JMP32: u8 = 0x06;
const LD: u8 = 0x00;
// Sizes.
const W: u8 = 0x00;
const H: u8 = 0x08;
const B: u8 = 0x10;
const DW: u8 = 0x18;
// Modes and sources.
const MEM: u8 = 0x60;
const IMM: u8 = 0x00;
const K: u8 = 0x00;
const X: u8 = 0x08;
// ALU operations.
const ADD: u8 = 0x00;
const AND: u8 = 0x50;
const MOV: u8 = 0xb0;
const END: u8 = 0xd0;
/// END's source bit: convert to big-endian (network order).
const TO_BE: u8 = 0x08;
// Jump operations.
const JA: u8 = 0x00;
const JEQ: u8 = 0x10;
const JGT: u8 = 0x20;
const JNE: u8 = 0x50;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;
/// `src_reg` of a 64-bit immediate load that names a map by descriptor.
const PSEUDO_MAP_FD: u8 = 1;

/// A width of memory access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    U8,
    U16,
    U32,
    U64,
}

impl Size {
    fn code(self) -> u8 {
        match self {
            Size::U8 => B,
            Size::U16 => H,
            Size::U32 => W,
            Size::U64 => DW,
        }
    }
}

/// A jump comparison (unsigned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Gt,
}

impl Cmp {
    fn code(self) -> u8 {
        match self {
            Cmp::Eq => JEQ,
            Cmp::Ne => JNE,
            Cmp::Gt => JGT,
        }
    }
}

/// A place in the program that jumps name before it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Label(usize);

/// Builds a program; jumps to labels are resolved by [`Asm::finish`].
#[derive(Default)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: HashMap<Label, usize>,
    next_label: usize,
    /// Jump instructions and the label each goes to.
    jumps: Vec<(usize, Label)>,
}

fn insn(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst.0 | src.0 << 4,
        off,
        imm,
    }
}

impl Asm {
    pub fn new() -> Asm {
        Asm::default()
    }

    /// A fresh label, placed later with [`Asm::place`].
    pub fn label(&mut self) -> Label {
        self.next_label += 1;
        Label(self.next_label)
    }

    /// The next instruction is `label`'s.
    pub fn place(&mut self, label: Label) {
        let at = self.insns.len();
        assert!(self.labels.insert(label, at).is_none(), "a label placed twice");
    }

    /// dst = imm
    pub fn mov_imm(&mut self, dst: Reg, imm: i32) {
        self.insns.push(insn(ALU64 | MOV | K, dst, R0, 0, imm));
    }

    /// dst = src
    pub fn mov(&mut self, dst: Reg, src: Reg) {
        self.insns.push(insn(ALU64 | MOV | X, dst, src, 0, 0));
    }

    /// dst += imm
    pub fn add_imm(&mut self, dst: Reg, imm: i32) {
        self.insns.push(insn(ALU64 | ADD | K, dst, R0, 0, imm));
    }

    /// dst &= imm
    pub fn and_imm(&mut self, dst: Reg, imm: i32) {
        self.insns.push(insn(ALU64 | AND | K, dst, R0, 0, imm));
    }

    /// dst = the low 16 bits of dst from network order to the host's (a byte swap on a
    /// little-endian host), zero-extended: for a field compared by size, not equality.
    pub fn from_be16(&mut self, dst: Reg) {
        self.insns.push(insn(ALU | END | TO_BE, dst, R0, 0, 16));
    }

    /// dst = *(size *)(src + off), zero-extended.
    pub fn load(&mut self, size: Size, dst: Reg, src: Reg, off: i16) {
        self.insns.push(insn(LDX | MEM | size.code(), dst, src, off, 0));
    }

    /// *(size *)(dst + off) = src
    pub fn store(&mut self, size: Size, dst: Reg, off: i16, src: Reg) {
        self.insns.push(insn(STX | MEM | size.code(), dst, src, off, 0));
    }

    /// dst = the map with descriptor `fd` (a 64-bit immediate load, two instructions).
    pub fn load_map(&mut self, dst: Reg, fd: i32) {
        self.insns.push(insn(LD | DW | IMM, dst, Reg(PSEUDO_MAP_FD), 0, fd));
        self.insns.push(Insn::default());
    }

    /// Jumps to `to` if `dst <cmp> imm` (64-bit, unsigned).
    pub fn jump_imm(&mut self, cmp: Cmp, dst: Reg, imm: i32, to: Label) {
        self.jumps.push((self.insns.len(), to));
        self.insns.push(insn(JMP | cmp.code() | K, dst, R0, 0, imm));
    }

    /// Jumps to `to` if the low 32 bits of `dst` `<cmp>` `imm` (taken as 32 bits: no sign
    /// extension, which a 64-bit comparison applies to the immediate).
    pub fn jump32_imm(&mut self, cmp: Cmp, dst: Reg, imm: u32, to: Label) {
        self.jumps.push((self.insns.len(), to));
        self.insns.push(insn(JMP32 | cmp.code() | K, dst, R0, 0, imm as i32));
    }

    /// dst = imm (a 64-bit immediate load, two instructions).
    pub fn load_imm64(&mut self, dst: Reg, imm: u64) {
        self.insns.push(insn(LD | DW | IMM, dst, R0, 0, imm as u32 as i32));
        self.insns.push(Insn {
            imm: (imm >> 32) as u32 as i32,
            ..Insn::default()
        });
    }

    /// Jumps to `to` if `dst <cmp> src` (64-bit, unsigned).
    pub fn jump_reg(&mut self, cmp: Cmp, dst: Reg, src: Reg, to: Label) {
        self.jumps.push((self.insns.len(), to));
        self.insns.push(insn(JMP | cmp.code() | X, dst, src, 0, 0));
    }

    /// Jumps to `to`.
    pub fn jump(&mut self, to: Label) {
        self.jumps.push((self.insns.len(), to));
        self.insns.push(insn(JMP | JA, R0, R0, 0, 0));
    }

    /// Calls kernel helper number `helper` (arguments in r1-r5, result in r0).
    pub fn call(&mut self, helper: i32) {
        self.insns.push(insn(JMP | CALL, R0, R0, 0, helper));
    }

    /// Returns r0.
    pub fn exit(&mut self) {
        self.insns.push(insn(JMP | EXIT, R0, R0, 0, 0));
    }

    /// The program, each jump's offset counted from the instruction after it.
    pub fn finish(mut self) -> Vec<Insn> {
        for &(at, label) in &self.jumps {
            let to = *self.labels.get(&label).expect("a jump to a label never placed");
            let off = to as isize - at as isize - 1;
            self.insns[at].off = i16::try_from(off).expect("a jump within 32 K instructions");
        }
        self.insns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodings checked against the instruction set document's tables.
    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        let mut a = Asm::new();
        let end = a.label();
        a.mov_imm(R0, 2); // b7 00 0000 02000000
        a.load(Size::U16, R5, R2, 12); // 69 25 0c00 00000000
        a.jump_imm(Cmp::Ne, R5, 0x0008, end); // 55 05 0100 08000000
        a.load_map(R1, 7); // 18 11 0000 07000000, then zeros
        a.place(end);
        a.exit(); // 95 00 0000 00000000
        let p = a.finish();
        assert_eq!(
            p[0],
            Insn {
                code: 0xb7,
                regs: 0x00,
                off: 0,
                imm: 2
            }
        );
        assert_eq!(
            p[1],
            Insn {
                code: 0x69,
                regs: 0x25,
                off: 12,
                imm: 0
            }
        );
        assert_eq!(
            p[2],
            Insn {
                code: 0x55,
                regs: 0x05,
                off: 2,
                imm: 8
            }
        );
        assert_eq!(
            p[3],
            Insn {
                code: 0x18,
                regs: 0x11,
                off: 0,
                imm: 7
            }
        );
        assert_eq!(p[4], Insn::default());
        assert_eq!(
            p[5],
            Insn {
                code: 0x95,
                regs: 0,
                off: 0,
                imm: 0
            }
        );
        assert_eq!(std::mem::size_of::<Insn>(), 8);
    }

    #[test]
    fn a_byte_swap_encodes_as_end_to_be() {
        let mut a = Asm::new();
        a.from_be16(R8); // dc 08 0000 10000000
        assert_eq!(
            a.finish()[0],
            Insn {
                code: 0xdc,
                regs: 0x08,
                off: 0,
                imm: 16
            }
        );
    }

    #[test]
    fn a_backward_jump_has_a_negative_offset() {
        let mut a = Asm::new();
        let top = a.label();
        a.place(top);
        a.mov_imm(R0, 0);
        a.jump(top);
        assert_eq!(a.finish()[1].off, -2);
    }
}

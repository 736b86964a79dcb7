package loader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
)

// The test collection, built with the asm package (no clang): both
// programs of the ABI, the per-endpoint constants in a .rodata of their
// own layout, the cellium_policy template and one "global" map,
// test_count, in which cil_from_container counts the packets of exactly
// countLen bytes (the test's UDP datagrams) and every program passes
// everything.
const (
	countMap = "test_count"
	// countLen is the length of a counted frame: 14 (Ethernet) + 20 (IP)
	// + 8 (UDP) + countPayload.
	countPayload = 1000
	countLen     = 14 + 20 + 8 + countPayload

	// Offsets of the constants in .rodata.
	offID, offAudit, offTrace, offIdentity, offIfindex, offIPv4, offMAC = 0, 2, 3, 4, 8, 12, 16
	offAggregation, offReportFlags, offReportInterval                   = 24, 25, 28
	rodataSize                                                          = 32
)

func rodataVar(name string, off uint32, size int) *ebpf.VariableSpec {
	return &ebpf.VariableSpec{Name: name, SectionName: ".rodata", Offset: off, Value: make([]byte, size)}
}

func policyTemplateSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: PolicyTemplate, Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 16}
}

func countSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: countMap, Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1}
}

// testSpec returns the test collection.
func testSpec() (*ebpf.CollectionSpec, error) {
	pass := func(name string, t ebpf.AttachType, count bool) *ebpf.ProgramSpec {
		ins := asm.Instructions{
			// Reading .rodata makes it part of the program.
			asm.LoadMapValue(asm.R2, 0, 0).WithReference(".rodata"),
			asm.LoadMem(asm.R2, asm.R2, offIdentity, asm.Word),
		}
		if count {
			ins = append(ins,
				asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // skb->len
				asm.JNE.Imm(asm.R2, countLen, "out"),
				asm.StoreImm(asm.RFP, -4, 0, asm.Word),
				asm.Mov.Reg(asm.R2, asm.RFP),
				asm.Add.Imm(asm.R2, -4),
				asm.LoadMapPtr(asm.R1, 0).WithReference(countMap),
				asm.FnMapLookupElem.Call(),
				asm.JEq.Imm(asm.R0, 0, "out"),
				asm.Mov.Imm(asm.R1, 1),
				asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			)
		}
		ins = append(ins,
			asm.Mov.Imm(asm.R0, 0).WithSymbol("out"), // TCX_PASS / TC_ACT_OK
			asm.Return(),
		)
		return &ebpf.ProgramSpec{Name: name, Type: ebpf.SchedCLS, AttachType: t, License: "GPL", Instructions: ins}
	}
	return &ebpf.CollectionSpec{
		Maps: map[string]*ebpf.MapSpec{
			".rodata": {Name: ".rodata", Type: ebpf.Array, KeySize: 4, ValueSize: rodataSize, MaxEntries: 1,
				Flags: unix.BPF_F_RDONLY_PROG, Contents: []ebpf.MapKV{{Key: uint32(0), Value: make([]byte, rodataSize)}}},
			PolicyTemplate: policyTemplateSpec(),
			countMap:       countSpec(),
		},
		Variables: map[string]*ebpf.VariableSpec{
			bpf.LxcVarENDPOINT_ID:       rodataVar(bpf.LxcVarENDPOINT_ID, offID, 2),
			bpf.LxcVarPOLICY_AUDIT_MODE: rodataVar(bpf.LxcVarPOLICY_AUDIT_MODE, offAudit, 1),
			bpf.LxcVarTRACE_ENABLED:     rodataVar(bpf.LxcVarTRACE_ENABLED, offTrace, 1),
			bpf.LxcVarSECURITY_IDENTITY: rodataVar(bpf.LxcVarSECURITY_IDENTITY, offIdentity, 4),
			bpf.LxcVarENDPOINT_IFINDEX:  rodataVar(bpf.LxcVarENDPOINT_IFINDEX, offIfindex, 4),
			bpf.LxcVarENDPOINT_MAC:      rodataVar(bpf.LxcVarENDPOINT_MAC, offMAC, 8),
			bpf.LxcVarENDPOINT_IPV4:     rodataVar(bpf.LxcVarENDPOINT_IPV4, offIPv4, 4),

			bpf.LxcVarMONITOR_AGGREGATION:     rodataVar(bpf.LxcVarMONITOR_AGGREGATION, offAggregation, 1),
			bpf.LxcVarMONITOR_REPORT_FLAGS:    rodataVar(bpf.LxcVarMONITOR_REPORT_FLAGS, offReportFlags, 1),
			bpf.LxcVarMONITOR_REPORT_INTERVAL: rodataVar(bpf.LxcVarMONITOR_REPORT_INTERVAL, offReportInterval, 4),
		},
		Programs: map[string]*ebpf.ProgramSpec{
			ProgFromContainer: pass(ProgFromContainer, ebpf.AttachTCXIngress, true),
			ProgToContainer:   pass(ProgToContainer, ebpf.AttachTCXEgress, false),
		},
	}, nil
}

// brokenSpec is testSpec with a cil_to_container the verifier rejects:
// it returns a register never written.
func brokenSpec() (*ebpf.CollectionSpec, error) {
	spec, _ := testSpec()
	spec.Programs[ProgToContainer].Instructions = asm.Instructions{
		asm.Mov.Reg(asm.R0, asm.R5),
		asm.Return(),
	}
	return spec, nil
}

// testMaps plays datapath/maps: the global map test_count and per
// endpoint policy maps, pinned in dir.
type testMaps struct {
	dir   string
	count *ebpf.Map
}

func newTestMaps(dir string) (*testMaps, error) {
	m, err := ebpf.NewMapWithOptions(countSpec(), ebpf.MapOptions{})
	if err != nil {
		return nil, err
	}
	if err := m.Pin(filepath.Join(dir, countMap)); err != nil && !errors.Is(err, os.ErrExist) {
		m.Close()
		return nil, err
	}
	return &testMaps{dir: dir, count: m}, nil
}

func (t *testMaps) Global() (map[string]*ebpf.Map, error) {
	return map[string]*ebpf.Map{countMap: t.count}, nil
}

func (t *testMaps) policyPin(id uint16) string {
	return filepath.Join(t.dir, fmt.Sprintf("cellium_policy_%05d", id))
}

func (t *testMaps) Policy(id uint16) (*ebpf.Map, error) {
	if m, err := ebpf.LoadPinnedMap(t.policyPin(id), nil); err == nil {
		return m, nil
	}
	m, err := ebpf.NewMap(policyTemplateSpec())
	if err != nil {
		return nil, err
	}
	if err := m.Pin(t.policyPin(id)); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func (t *testMaps) RemovePolicy(id uint16) error {
	if err := os.Remove(t.policyPin(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (t *testMaps) counted() (uint64, error) {
	var n uint64
	err := t.count.Lookup(uint32(0), &n)
	return n, err
}

func (t *testMaps) Close() error { return t.count.Close() }

// rodata reads the constants of the program with id prog.
func rodata(prog ebpf.ProgramID) (id uint16, audit uint8, identity, ifindex uint32, mac uint64, err error) {
	p, err := ebpf.NewProgramFromID(prog)
	if err != nil {
		return
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return
	}
	ids, _ := info.MapIDs()
	for _, mid := range ids {
		m, merr := ebpf.NewMapFromID(mid)
		if merr != nil {
			continue
		}
		mi, _ := m.Info()
		if mi == nil || mi.ValueSize != rodataSize || mi.Flags&unix.BPF_F_RDONLY_PROG == 0 {
			m.Close()
			continue
		}
		b := make([]byte, rodataSize)
		err = m.Lookup(uint32(0), &b)
		m.Close()
		if err != nil {
			return
		}
		le := binary.LittleEndian
		return le.Uint16(b[offID:]), b[offAudit], le.Uint32(b[offIdentity:]), le.Uint32(b[offIfindex:]), le.Uint64(b[offMAC:]), nil
	}
	err = errors.New("program has no .rodata map")
	return
}

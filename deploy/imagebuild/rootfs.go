package imagebuild

import (
	"bytes"
	"crypto/sha256"
	"encoding/pem"
	"fmt"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// NonRootUID is the user (and group) the control plane runs as: the
// "nonroot" user of distroless images.
const NonRootUID = 65532

// Paths inside the control plane image.
const (
	ControlPlanePath = "/usr/local/bin/sluice-controlplane"
	RatectlPath      = "/usr/local/bin/ratectl"
	// RatelimitPath is what Envoy Gateway's ratelimit Deployment runs: a
	// link to sluice-controlplane, which reads envoyproxy/ratelimit's
	// environment when started under the name ratelimit.
	RatelimitPath = "/bin/ratelimit"
	CABundlePath  = "/etc/ssl/certs/ca-certificates.crt"
)

// CABundle returns the PEM bundle of the Mozilla root certificates that
// golang.org/x/crypto/x509roots/fallback carries (a pinned module version,
// so the bundle does not depend on the building machine). Roots that the
// bundle trusts only under a constraint (a distrust date) are left out: a
// PEM file cannot carry the constraint.
func CABundle() ([]byte, error) {
	var buf bytes.Buffer
	n := 0
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		fmt.Fprintf(&buf, "# sha256 %x\n", sha256.Sum256(r.Certificate))
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, err
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("imagebuild: the fallback bundle holds no root certificate")
	}
	return buf.Bytes(), nil
}

// baseEntries are the files every platform of the control plane image
// shares: the users, the CA bundle, a /tmp for the policy store's
// temporary file (mount an emptyDir there under a read-only root
// filesystem) and the licence. No shell, no package manager.
func baseEntries(license []byte) ([]Entry, error) {
	ca, err := CABundle()
	if err != nil {
		return nil, err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRootUID, NonRootUID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", NonRootUID)
	return []Entry{
		{Path: "etc/passwd", Mode: 0o644, Data: []byte(passwd)},
		{Path: "etc/group", Mode: 0o644, Data: []byte(group)},
		{Path: CABundlePath, Mode: 0o644, Data: ca},
		{Path: "tmp", Dir: true, Mode: 0o1777},
		{Path: "home/nonroot", Dir: true, Mode: 0o700, UID: NonRootUID, GID: NonRootUID},
		{Path: "root", Dir: true, Mode: 0o700},
		{Path: "usr/share/doc/sluice/LICENSE", Mode: 0o644, Data: license},
	}, nil
}

// binaryEntries are one platform's programs.
func binaryEntries(controlPlane, ratectl []byte) []Entry {
	return []Entry{
		{Path: ControlPlanePath, Mode: 0o755, Data: controlPlane},
		{Path: RatectlPath, Mode: 0o755, Data: ratectl},
		// Relative, so that it resolves inside an unpacked root too.
		{Path: RatelimitPath, Symlink: "../usr/local/bin/sluice-controlplane"},
	}
}

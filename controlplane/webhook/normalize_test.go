package webhook_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane/webhook"
)

func loadPayloads(t *testing.T) []fakegh.Payload {
	t.Helper()
	payloads, err := fakegh.Payloads()
	if err != nil {
		t.Fatal(err)
	}
	if len(payloads) < 100 {
		t.Fatalf("found only %d payloads", len(payloads))
	}
	return payloads
}

func loadPayload(t *testing.T, event, name string) []byte {
	t.Helper()
	body, err := fakegh.LoadPayload(event, name)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// generic is the loosely typed view of a payload used to cross-check the
// typed record.
type generic struct {
	Action       *string `json:"action"`
	Installation *struct {
		ID int64 `json:"id"`
	} `json:"installation"`
	Repository *struct {
		ID       int64  `json:"id"`
		FullName string `json:"full_name"`
	} `json:"repository"`
}

var handled = map[string]bool{
	"installation": true, "installation_repositories": true, "push": true, "release": true,
	"check_run": true, "check_suite": true, "workflow_run": true, "ping": true,
}

func TestNormalizeEveryCorpusPayload(t *testing.T) {
	t.Parallel()
	seen := map[string]int{}
	for _, p := range loadPayloads(t) {
		t.Run(p.Event+"/"+p.Name, func(t *testing.T) {
			n, err := webhook.Normalize(p.Event, p.Body)
			if err != nil {
				t.Fatalf("Normalize: %v", err)
			}
			var g generic
			if err := json.Unmarshal(p.Body, &g); err != nil {
				t.Fatal(err)
			}
			if n.Event != p.Event {
				t.Errorf("Event = %q, want %q", n.Event, p.Event)
			}
			if g.Action != nil && n.Action != *g.Action {
				t.Errorf("Action = %q, want %q", n.Action, *g.Action)
			}
			if g.Installation != nil && n.InstallationID != g.Installation.ID {
				t.Errorf("InstallationID = %d, want %d", n.InstallationID, g.Installation.ID)
			}
			if g.Repository != nil && (n.RepositoryID != g.Repository.ID || n.RepositoryFullName != g.Repository.FullName) {
				t.Errorf("repository = %d %q, want %d %q", n.RepositoryID, n.RepositoryFullName, g.Repository.ID, g.Repository.FullName)
			}
			if n.Ignored == handled[p.Event] {
				t.Errorf("Ignored = %v for event %q", n.Ignored, p.Event)
			}
			if sections := countSections(n); sections != map[bool]int{true: 1, false: 0}[handled[p.Event]] {
				t.Errorf("%d event sections set", sections)
			}
			checkHandledFields(t, p.Event, n)
			enc, err := json.Marshal(n)
			if err != nil {
				t.Fatal(err)
			}
			if len(enc) >= webhook.MaxEncodedBytes {
				t.Errorf("encoded record is %d bytes", len(enc))
			}
			var back webhook.Normalized
			if err := json.Unmarshal(enc, &back); err != nil || !reflect.DeepEqual(back, n) {
				t.Errorf("JSON round trip changed the record (err %v)", err)
			}
		})
		seen[p.Event]++
	}
	for event := range handled {
		if seen[event] == 0 {
			t.Errorf("corpus has no payload for handled event %q", event)
		}
	}
}

func countSections(n webhook.Normalized) int {
	c := 0
	for _, set := range []bool{
		n.Installation != nil, n.InstallationRepositories != nil, n.Push != nil, n.Release != nil,
		n.CheckRun != nil, n.CheckSuite != nil, n.WorkflowRun != nil, n.Ping != nil,
	} {
		if set {
			c++
		}
	}
	return c
}

// checkHandledFields asserts that the fields the lifecycle worker needs are
// filled for every corpus payload of a handled event (each of them carries
// them).
func checkHandledFields(t *testing.T, event string, n webhook.Normalized) {
	t.Helper()
	switch event {
	case "installation":
		s := n.Installation
		if n.InstallationID == 0 || s.AccountLogin == "" || s.AccountID == 0 || s.AppID == 0 {
			t.Errorf("installation section incomplete: %+v (installation %d)", s, n.InstallationID)
		}
		if n.Action == "created" && len(s.Repositories.Repositories) == 0 {
			t.Errorf("created without repositories: %+v", s)
		}
	case "installation_repositories":
		s := n.InstallationRepositories
		list := s.Added
		if n.Action == "removed" {
			list = s.Removed
		}
		if n.InstallationID == 0 || len(list.Repositories) == 0 || list.Repositories[0].ID == 0 || list.Repositories[0].FullName == "" {
			t.Errorf("installation_repositories section incomplete: %+v", s)
		}
	case "push":
		s := n.Push
		if s.Ref == "" || len(s.After) != 40 || len(s.Before) != 40 || s.DefaultBranch == "" || n.RepositoryID == 0 {
			t.Errorf("push section incomplete: %+v", s)
		}
	case "release":
		if n.Action == "" || n.Release.TagName == "" || n.Release.ID == 0 {
			t.Errorf("release section incomplete: %+v", n.Release)
		}
	case "check_run":
		s := n.CheckRun
		if s.ID == 0 || s.Name == "" || len(s.HeadSHA) != 40 || s.Status == "" || s.AppID == 0 {
			t.Errorf("check_run section incomplete: %+v", s)
		}
		if (n.Action == "requested_action") != (s.RequestedActionIdentifier != "") {
			t.Errorf("requested action identifier %q for action %q", s.RequestedActionIdentifier, n.Action)
		}
	case "check_suite":
		if s := n.CheckSuite; s.ID == 0 || len(s.HeadSHA) != 40 || s.Status == "" {
			t.Errorf("check_suite section incomplete: %+v", s)
		}
	case "workflow_run":
		s := n.WorkflowRun
		if s.ID == 0 || s.WorkflowID == 0 || s.Path == "" || s.DisplayTitle == "" || len(s.HeadSHA) != 40 || s.Status == "" || s.RunAttempt == 0 {
			t.Errorf("workflow_run section incomplete: %+v", s)
		}
		if n.Action == "completed" && s.Conclusion == "" {
			t.Errorf("completed run without conclusion: %+v", s)
		}
	case "ping":
		if n.Ping.Zen == "" || n.Ping.HookID == 0 {
			t.Errorf("ping section incomplete: %+v", n.Ping)
		}
	}
}

func TestNormalizeExactValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		event, file string
		want        webhook.Normalized
	}{
		{
			event: "installation", file: "created.payload.json",
			want: webhook.Normalized{
				Event: "installation", Action: "created", InstallationID: 957387,
				Installation: &webhook.Installation{
					AccountLogin: "Codertocat", AccountID: 21031067, AccountType: "User", AppID: 29310,
					RepositorySelection: "selected",
					Repositories: webhook.RepositoryList{
						Repositories: []webhook.Repository{{ID: 186853002, FullName: "Codertocat/Hello-World"}},
						Total:        1,
					},
				},
			},
		},
		{
			event: "installation_repositories", file: "added.payload.json",
			want: webhook.Normalized{
				Event: "installation_repositories", Action: "added", InstallationID: 957387,
				InstallationRepositories: &webhook.InstallationRepositories{
					RepositorySelection: "selected",
					Added: webhook.RepositoryList{
						Repositories: []webhook.Repository{{ID: 186853007, FullName: "Codertocat/Space"}},
						Total:        1,
					},
				},
			},
		},
		{
			event: "push", file: "with-new-branch.payload.json",
			want: webhook.Normalized{
				Event: "push", InstallationID: 1, RepositoryID: 186853002, RepositoryFullName: "Codertocat/Hello-World",
				Push: &webhook.Push{
					Ref: "refs/heads/master", Before: "0000000000000000000000000000000000000000",
					After: "6113728f27ae82c7b1a177c8d03f9e96e0adf246", Created: true, DefaultBranch: "master",
				},
			},
		},
		{
			event: "check_run", file: "requested_action.payload.json",
			want: webhook.Normalized{
				Event: "check_run", Action: "requested_action", InstallationID: 690857, RepositoryID: 9384267,
				RepositoryFullName: "electron/electron",
				CheckRun: &webhook.CheckRun{
					ID: 1494503112, Name: "API Review", HeadSHA: "5bd5f196a46b8222fb7484f05faba41a73cf34bd",
					Status: "in_progress", AppID: 25811, RequestedActionIdentifier: "lgtm|26764",
				},
			},
		},
		{
			event: "workflow_run", file: "completed.payload.json",
			want: webhook.Normalized{
				Event: "workflow_run", Action: "completed", RepositoryID: 300029405, RepositoryFullName: "octo-org/octo-repo",
				WorkflowRun: &webhook.WorkflowRun{
					ID: 289782451, WorkflowID: 2823525, Path: ".github/workflows/test.yml",
					DisplayTitle: "ci(action): update actions/setup-node digest to 8c91899",
					HeadSHA:      "3484a3fb816e0859fd6e1cea078d76385ff50625", HeadBranch: "master",
					TriggerEvent: "repository_dispatch", Status: "completed", Conclusion: "success",
					RunAttempt: 1, RunNumber: 163,
				},
			},
		},
		{
			event: "ping", file: "with-app_id.payload.json",
			want: webhook.Normalized{
				Event: "ping", RepositoryID: 186853261, RepositoryFullName: "Octocoders/Hello-World",
				Ping: &webhook.Ping{Zen: "Anything added dilutes everything else.", HookID: 109948940, AppID: 29310},
			},
		},
		{
			event: "release", file: "created.with-installation.payload.json",
			want: webhook.Normalized{
				Event: "release", Action: "created", InstallationID: 1, RepositoryID: 186853002,
				RepositoryFullName: "Codertocat/Hello-World",
				Release:            &webhook.Release{ID: 17372790, TagName: "0.0.1", TargetCommitish: "master"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.event+"/"+tt.file, func(t *testing.T) {
			t.Parallel()
			got, err := webhook.Normalize(tt.event, loadPayload(t, tt.event, tt.file))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				gotJSON, _ := json.Marshal(got)
				wantJSON, _ := json.Marshal(tt.want)
				t.Fatalf("Normalize =\n%s\nwant\n%s", gotJSON, wantJSON)
			}
		})
	}
}

func TestNormalizeTagPushVariant(t *testing.T) {
	t.Parallel()
	var payload map[string]any
	if err := json.Unmarshal(loadPayload(t, "push", "with-installation.payload.json"), &payload); err != nil {
		t.Fatal(err)
	}
	payload["ref"] = "refs/tags/v1.2.3"
	payload["created"], payload["deleted"] = true, false
	payload["before"] = "0000000000000000000000000000000000000000"
	payload["after"] = "6113728f27ae82c7b1a177c8d03f9e96e0adf246"
	body, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	n, err := webhook.Normalize("push", body)
	if err != nil {
		t.Fatal(err)
	}
	want := webhook.Push{
		Ref: "refs/tags/v1.2.3", Before: "0000000000000000000000000000000000000000",
		After: "6113728f27ae82c7b1a177c8d03f9e96e0adf246", Created: true, DefaultBranch: "master",
	}
	if *n.Push != want || n.InstallationID != 1 || n.RepositoryID != 186853002 {
		t.Fatalf("Normalize = %+v / %+v", n, *n.Push)
	}
}

func TestNormalizeIgnoredEventKeepsIDs(t *testing.T) {
	t.Parallel()
	n, err := webhook.Normalize("issues", []byte(`{"action":"opened","installation":{"id":42},"repository":{"id":7,"full_name":"o/r"},"issue":{"number":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := webhook.Normalized{Event: "issues", Action: "opened", Ignored: true, InstallationID: 42, RepositoryID: 7, RepositoryFullName: "o/r"}
	if !reflect.DeepEqual(n, want) {
		t.Fatalf("Normalize = %+v, want %+v", n, want)
	}
	enc, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	const wantJSON = `{"event":"issues","action":"opened","ignored":true,"installation_id":42,"repository_id":7,"repository_full_name":"o/r"}`
	if string(enc) != wantJSON {
		t.Fatalf("JSON = %s, want %s", enc, wantJSON)
	}
}

func TestNormalizeMalformed(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, event, body string }{
		{"not JSON", "push", `not json`},
		{"empty body", "push", ``},
		{"array", "push", `[]`},
		{"null", "ping", `null`},
		{"string", "ping", `"x"`},
		{"truncated", "push", `{"ref":"refs/tags/v1"`},
		{"trailing garbage", "push", `{"ref":"refs/tags/v1"} x`},
		{"installation id is a string", "issues", `{"installation":{"id":"42"}}`},
		{"repository is a list", "issues", `{"repository":[]}`},
		{"check run id is a string", "check_run", `{"action":"created","check_run":{"id":"1"}}`},
		{"push ref is a number", "push", `{"ref":1}`},
		{"repositories is an object", "installation", `{"action":"created","repositories":{}}`},
		{"workflow run attempt is a string", "workflow_run", `{"workflow_run":{"id":1,"run_attempt":"1"}}`},
		{"empty event name", "", `{}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := webhook.Normalize(tt.event, []byte(tt.body))
			if !errors.Is(err, webhook.ErrMalformed) {
				t.Fatalf("Normalize = %v, want ErrMalformed", err)
			}
		})
	}
}

func TestNormalizeNullsAreEmpty(t *testing.T) {
	t.Parallel()
	n, err := webhook.Normalize("workflow_run", []byte(`{"action":"requested","workflow_run":{"id":5,"conclusion":null,"display_title":null},"installation":null,"repository":null}`))
	if err != nil {
		t.Fatal(err)
	}
	if n.WorkflowRun == nil || n.WorkflowRun.ID != 5 || n.WorkflowRun.Conclusion != "" || n.InstallationID != 0 {
		t.Fatalf("Normalize = %+v", n)
	}
}

// TestNormalizeIsBounded feeds adversarial payloads (huge strings full of
// characters that JSON escapes, thousands of repositories, invalid UTF-8) and
// checks every record stays under MaxEncodedBytes.
func TestNormalizeIsBounded(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("<&>\x01\"", 2_000) + "\xff\xfe"
	longName := strings.Repeat("<", 2*webhook.MaxStringBytes)
	repos := make([]map[string]any, 300)
	for i := range repos {
		repos[i] = map[string]any{"id": i + 1, "full_name": longName}
	}
	smallRepos := make([]map[string]any, 1500)
	for i := range smallRepos {
		smallRepos[i] = map[string]any{"id": i + 1, "full_name": "o/r"}
	}
	obj := map[string]any{"id": 1, "name": huge, "login": huge, "type": huge}
	str := func(keys ...string) map[string]any {
		m := map[string]any{"id": 1}
		for _, k := range keys {
			m[k] = huge
		}
		return m
	}
	repo := map[string]any{"id": 9, "full_name": huge, "default_branch": huge}
	inst := map[string]any{"id": 3, "account": obj, "repository_selection": huge, "app_id": 4}
	payloads := map[string]map[string]any{
		"installation": {"action": huge, "installation": inst, "repositories": repos},
		"installation_repositories": {
			"action": huge, "installation": inst, "repository_selection": huge,
			"repositories_added": repos, "repositories_removed": repos,
		},
		"push":         {"ref": huge, "before": huge, "after": huge, "repository": repo, "installation": inst},
		"release":      {"action": huge, "release": str("tag_name", "target_commitish"), "repository": repo},
		"check_run":    {"action": huge, "check_run": str("name", "external_id", "head_sha", "status", "conclusion"), "requested_action": map[string]any{"identifier": huge}, "repository": repo},
		"check_suite":  {"action": huge, "check_suite": str("head_sha", "head_branch", "status", "conclusion"), "repository": repo},
		"workflow_run": {"action": huge, "workflow_run": str("name", "path", "display_title", "head_sha", "head_branch", "event", "status", "conclusion"), "repository": repo},
		"ping":         {"zen": huge, "hook_id": 1, "repository": repo},
		huge:           {"action": huge, "repository": repo},
	}
	for event, payload := range payloads {
		body, err := json.Marshal(payload)
		if err != nil {
			t.Fatal(err)
		}
		n, err := webhook.Normalize(event, body)
		if err != nil {
			t.Fatalf("%.20q: %v", event, err)
		}
		enc, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(enc) >= webhook.MaxEncodedBytes {
			t.Errorf("%.20q: encoded record is %d bytes, bound is %d", event, len(enc), webhook.MaxEncodedBytes)
		}
		if n.Event == "" || (payload["action"] != nil && n.Action == "") || (payload["repository"] != nil && n.RepositoryFullName == "") {
			t.Errorf("%.20q: a bounded string became empty: %.100q %.100q %.100q", event, n.Event, n.Action, n.RepositoryFullName)
		}
		for _, s := range []string{n.Event, n.Action, n.RepositoryFullName} {
			b, _ := json.Marshal(s)
			if len(b)-2 > webhook.MaxStringBytes {
				t.Errorf("%.20q: string encodes to %d bytes", event, len(b)-2)
			}
		}
	}

	// Many short names: the count bound applies.
	body, err := json.Marshal(map[string]any{"action": "created", "installation": inst, "repositories": smallRepos})
	if err != nil {
		t.Fatal(err)
	}
	n, err := webhook.Normalize("installation", body)
	if err != nil {
		t.Fatal(err)
	}
	l := n.Installation.Repositories
	if len(l.Repositories) != webhook.MaxRepositories || !l.Truncated || l.Total != 1500 || l.Repositories[999].ID != 1000 {
		t.Fatalf("list = %d entries, truncated %v, total %d", len(l.Repositories), l.Truncated, l.Total)
	}
}

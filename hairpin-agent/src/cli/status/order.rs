//! `status`'s `order` lines: where hairpin's connect programs run among the other
//! connect programs at the cgroup, what runs in front of them (a socket load balancer
//! there hides the LB address), and the remedy.

use super::{Tone, paint};

/// `order`: where the connect programs run among the others at the cgroup, and what
/// runs in front of them (a socket load balancer there hides the LB address).
pub(super) fn render(out: &mut String, order: &crate::status::LinkOrderStatus, colour: bool) {
    use crate::status::ForeignProgram;
    out.push_str(&format!("order       connect links {}\n", order.ordering));
    let list = |ps: &[ForeignProgram]| {
        ps.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    for h in &order.hooks {
        let line = if h.in_front.is_empty() {
            let after = if h.behind.is_empty() {
                String::new()
            } else {
                format!(", then {}", list(&h.behind))
            };
            format!("{}: hairpin first{after}", h.hook)
        } else {
            paint(
                &format!(
                    "{}: {} runs before hairpin's program (id {}): a socket load balancer \
                     there hides the LB address",
                    h.hook,
                    list(&h.in_front),
                    h.program_id
                ),
                Tone::Bad,
                colour,
            )
        };
        out.push_str(&format!("            {line}\n"));
    }
    if let Some(c) = &order.children {
        out.push_str(&format!(
            "            connect4, connect6: hairpin first at each child cgroup ({}), \
             before the root's {}\n",
            c.cgroups.join(", "),
            list(&c.at_root)
        ));
        if c.root_processes > 0 {
            out.push_str(&format!(
                "            {}\n",
                paint(
                    &format!(
                        "{} processes in the root cgroup itself meet the root's programs first",
                        c.root_processes
                    ),
                    Tone::Warn,
                    colour
                )
            ));
        }
    }
    let unnamed = order
        .blocked()
        .flat_map(|h| &h.in_front)
        .find_map(|p| p.name_unknown.as_deref());
    if let Some(why) = unnamed {
        out.push_str(&format!("            names: {why}\n"));
    }
    if order.blocked().next().is_some() {
        out.push_str(&format!("            fix: {}\n", order.remedy()));
    }
    if let Some(e) = &order.error {
        out.push_str(&format!("            {}\n", paint(e, Tone::Warn, colour)));
    }
}

#[cfg(test)]
mod tests {
    use crate::status::{ForeignProgram, HookOrderStatus, LinkOrderStatus};

    fn hook(in_front: Vec<ForeignProgram>, behind: Vec<ForeignProgram>) -> HookOrderStatus {
        HookOrderStatus {
            hook: "connect4".into(),
            program_id: 8,
            attached: true,
            in_front,
            behind,
        }
    }

    fn render(order: &LinkOrderStatus) -> String {
        let mut out = String::new();
        super::render(&mut out, order, false);
        out
    }

    #[test]
    fn a_program_in_front_is_named_with_why_its_name_is_missing_and_the_remedy() {
        let unnamed = ForeignProgram {
            id: 12,
            name: None,
            name_unknown: Some("its name needs CAP_SYS_ADMIN".into()),
        };
        let order = LinkOrderStatus {
            ordering: "appended: --link-order append".into(),
            first: false,
            hooks: vec![hook(vec![unnamed], Vec::new())],
            error: None,
            children: None,
        };
        let text = render(&order);
        assert!(
            text.contains("connect4: program id 12 runs before hairpin's program (id 8)"),
            "{text}"
        );
        assert!(
            text.contains("names: its name needs CAP_SYS_ADMIN"),
            "{text}"
        );
        assert!(
            text.contains("fix: hairpin's connect programs must run first"),
            "{text}"
        );
    }

    #[test]
    fn first_says_so_and_names_what_runs_after() {
        let after = ForeignProgram {
            id: 12,
            name: Some("cil_sock4_conne".into()),
            name_unknown: None,
        };
        let order = LinkOrderStatus {
            ordering: "before every other program (BPF_F_BEFORE)".into(),
            first: true,
            hooks: vec![hook(Vec::new(), vec![after])],
            error: None,
            children: None,
        };
        let text = render(&order);
        assert!(
            text.contains("connect4: hairpin first, then cil_sock4_conne (id 12)"),
            "{text}"
        );
        assert!(!text.contains("fix:"), "{text}");
    }
}

// Writing broadcast state from the data side: one record of one key would change what
// every other parallel instance sees, so `process_element` gets a read-only view.
use weir_core::prelude::*;

struct Alerts {
    limits: BroadcastStateDescriptor<String, i64>,
}

impl BroadcastProcessFunction<String, (String, i64), (String, i64), String> for Alerts {
    fn process_element(
        &mut self,
        (sensor, value): (String, i64),
        ctx: &mut ReadOnlyContext<'_, String, String>,
    ) -> weir_core::Result<()> {
        let mut limits = ctx.broadcast_state(&self.limits)?;
        limits.put(sensor, value);
        Ok(())
    }

    fn process_broadcast_element(
        &mut self,
        (sensor, limit): (String, i64),
        ctx: &mut BroadcastContext<'_, String, String>,
    ) -> weir_core::Result<()> {
        ctx.broadcast_state(&self.limits)?.put(sensor, limit);
        Ok(())
    }
}

fn main() {}

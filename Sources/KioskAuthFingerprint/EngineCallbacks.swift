import CFPrint

// MARK: - C callbacks (user data: the Engine, unretained; it outlives every connection)

let deviceAddedHandler:
    @convention(c) (UnsafeMutablePointer<FpContext>?, UnsafeMutablePointer<FpDevice>?, gpointer?) -> Void = {
        _, device, engine in Engine.from(engine).deviceAdded(device!)
    }

let contextDeviceRemovedHandler:
    @convention(c) (UnsafeMutablePointer<FpContext>?, UnsafeMutablePointer<FpDevice>?, gpointer?) -> Void = {
        _, device, engine in Engine.from(engine).contextDeviceRemoved(device!)
    }

let deviceRemovedHandler: @convention(c) (UnsafeMutablePointer<FpDevice>?, gpointer?) -> Void = {
    device, engine in Engine.from(engine).deviceRemoved(device!)
}

let fingerStatusHandler: @convention(c) (gpointer?, gpointer?, gpointer?) -> Void = {
    device, _, engine in
    Engine.from(engine).fingerStatusChanged(device!.assumingMemoryBound(to: FpDevice.self))
}

/// A match report (verify, identify): the matching gallery print, if any, and the error that
/// accompanies a rejected touch. Both are borrowed.
typealias MatchReport = CallbackBox<(OpaquePointer?, UnsafeMutablePointer<GError>?)>

let matchReportTrampoline: FpMatchCb = { _, match, _, box, error in
    MatchReport.borrow(box).body((match, error))
}

let releaseMatchReport: GDestroyNotify = { pointer in
    Unmanaged<MatchReport>.fromOpaque(pointer!).release()
}

let enrollProgressTrampoline: FpEnrollProgress = { _, stage, _, box, error in
    CallbackBox<(Int, UnsafeMutablePointer<GError>?)>.borrow(box).body((Int(stage), error))
}

let releaseProgressBox: GDestroyNotify = { pointer in
    Unmanaged<CallbackBox<(Int, UnsafeMutablePointer<GError>?)>>.fromOpaque(pointer!).release()
}

extension Finger {
    var fpFinger: FpFinger {
        switch self {
        case .leftThumb: FP_FINGER_LEFT_THUMB
        case .leftIndex: FP_FINGER_LEFT_INDEX
        case .leftMiddle: FP_FINGER_LEFT_MIDDLE
        case .leftRing: FP_FINGER_LEFT_RING
        case .leftLittle: FP_FINGER_LEFT_LITTLE
        case .rightThumb: FP_FINGER_RIGHT_THUMB
        case .rightIndex: FP_FINGER_RIGHT_INDEX
        case .rightMiddle: FP_FINGER_RIGHT_MIDDLE
        case .rightRing: FP_FINGER_RIGHT_RING
        case .rightLittle: FP_FINGER_RIGHT_LITTLE
        }
    }
}

/// Six-digit passcodes people choose far more often than chance would predict.
///
/// Drawn from published studies of human-chosen PINs (for example Markert et al., "This PIN Can
/// Be Easily Guessed", IEEE S&P 2020, whose top ten lead this list) and from the shapes those
/// studies keep finding: keypad lines and crosses, mirrored halves, years and well-known numbers.
/// Many entries are also caught by the rules in ``PasscodePolicy`` (repeated digits, sequences,
/// repeated patterns); they stay here so the list stands on its own. Dates of birth are not
/// refused: they are only weak against someone who knows the person, and refusing them would
/// refuse a third of all codes. Organisations add their own entries with
/// ``PasscodePolicy/extraCommonPasscodes``.
enum CommonPasscodes {
    /// The built-in list, ASCII digits only.
    static let all: Set<String> = [
        // The ten most common six-digit PINs (Markert et al. 2020), in order.
        "123456", "654321", "111111", "000000", "123123",
        "666666", "121212", "112233", "789456", "159753",
        // One digit throughout.
        "222222", "333333", "444444", "555555", "777777", "888888", "999999",
        // Counting up or down, shifted or nearly.
        "234567", "345678", "456789", "987654", "876543", "765432", "012345", "098765",
        "123457", "123465", "123450", "124578", "135790", "135791", "246802", "246810",
        "102030", "123654", "654123", "321654", "456123", "789123", "123789", "123000",
        // Repeated halves, thirds and pairs.
        "101010", "131313", "141414", "151515", "202020", "212121", "232323", "252525",
        "321321", "456456", "789789", "987987", "147147", "159159", "258258", "369369",
        "520520", "521521", "852852", "696969", "110110", "100100", "111222", "222333",
        "112211", "121121", "112112", "123412", "123451", "111000", "000111", "999000",
        // Mirrored halves.
        "123321", "321123", "100001", "110011", "159951", "147741",
        // Keypad lines, columns and crosses (phone layout 123/456/789/0).
        "147258", "258369", "147852", "741852", "852963", "963852", "369258", "258456",
        "456852", "789654", "147369", "741963", "963741", "147896", "159357", "357159",
        "753951", "951753", "753159", "142536", "102938", "080808", "258000",
        // A factory default, numbers people know by heart, lucky and loving numbers, turns of
        // the century.
        "000001", "100000", "200000", "112358", "314159", "271828", "007007", "786786",
        "168168", "131420", "520131", "201314", "199999", "200001",
    ]
}
